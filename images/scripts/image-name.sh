#!/usr/bin/env bash
# Print the local tag of one of the project's images, as the build scripts name it.
#
#   images/scripts/image-name.sh base|runtime|model|cache [ARCH] [MODEL]
#
# ARCH defaults to the host's, MODEL to models.default of images/lock.toml. Ansible's
# service role and the host checks use it, so the naming lives in lib.sh alone.
set -euo pipefail
# shellcheck source=lib.sh source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

[[ $# -ge 1 ]] || die "usage: image-name.sh base|runtime|model|cache [ARCH] [MODEL]"
image_name "$1" "${2:-$(host_arch)}" "${3:-$(lock models.default)}"
