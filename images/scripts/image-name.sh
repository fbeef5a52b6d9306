#!/usr/bin/env bash
# Print the local tag of one of the project's images, as the build scripts name it.
#
#   images/scripts/image-name.sh base|runtime|model|cache [ARCH] [MODEL]
#
# ARCH defaults to the host's, MODEL to models.default of images/lock.toml, or with
# SGLANG_RVV_CHECKPOINT_DIR to that directory's key (lib.sh model_key). Ansible's
# service role and the host checks use it, so the naming lives in lib.sh alone.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

[[ $# -ge 1 ]] || die "usage: image-name.sh base|runtime|model|cache [ARCH] [MODEL]"
key=$(model_key "${3:-}")
image_name "$1" "${2:-$(host_arch)}" "${key}"
