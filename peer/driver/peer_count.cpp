// peer-count: the llama.cpp side of the board model's instrument. It runs the phases the
// appliance's own counted workload runs (app/sglang_rvv/boardmodel/guest.py), on a GGUF file,
// and writes a mark between them, so the counting qemu plugin (boardmodel/plugin/count.c)
// attributes each phase as it does ours:
//
//   mark 1, a PROMPT-token prefill, mark 2, then one mark after each of STEPS greedy decode
//   steps at M=1 (marks 3..), then the memory cleared, a mark, a PREFILL-token prefill in one
//   batch, and a last mark.
//
// A mark is a write(2) of N bytes to MARK_FD, a descriptor no program has open: the plugin sees
// the call, the guest gets EBADF. Tokens are drawn from a fixed seed, as the guest's are, so a
// GGUF without a tokenizer ("no_vocab") counts as well as one with.
//
//   peer-count MODEL.gguf [--threads N] [--prompt N] [--steps N] [--prefill N] [--no-repack] [--maps FILE]
//
// On the last line of stdout it prints one JSON object: the decoded tokens and the settings. With
// --maps it copies its /proc/self/maps into FILE at the end: what attributes the counts to
// libraries (under qemu-user, the guest's own mappings).
// Any failure is one line on stderr and a nonzero exit.
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

static const int MARK_FD = 0x434F554E;  // == count.c MARK_FD

static void mark(int n) {
    std::string bytes(n, 'x');
    if (write(MARK_FD, bytes.data(), bytes.size()) >= 0) {
        // Never: the descriptor is not open. A program that had it open would corrupt a file.
        std::fprintf(stderr, "peer-count: descriptor %d is open; marks would write into it\n", MARK_FD);
        std::exit(3);
    }
}

static void quiet(enum ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_ERROR) {
        std::fputs(text, stderr);
    }
}

static int fail(const std::string & what) {
    std::fprintf(stderr, "peer-count: error: %s\n", what.c_str());
    return 2;
}

static bool int_arg(int argc, char ** argv, int & i, int & out) {
    if (i + 1 >= argc) {
        return false;
    }
    char * end = nullptr;
    long value = std::strtol(argv[++i], &end, 10);
    if (*end != '\0' || value < 0 || value > 1 << 20) {
        return false;
    }
    out = static_cast<int>(value);
    return true;
}

int main(int argc, char ** argv) {
    std::string path, maps;
    int threads = 1, prompt = 4, steps = 3, prefill = 128;
    bool repack = true;
    for (int i = 1; i < argc; ++i) {
        std::string arg = argv[i];
        bool ok = true;
        if (arg == "--threads") {
            ok = int_arg(argc, argv, i, threads) && threads > 0;
        } else if (arg == "--prompt") {
            ok = int_arg(argc, argv, i, prompt) && prompt > 0;
        } else if (arg == "--steps") {
            ok = int_arg(argc, argv, i, steps);
        } else if (arg == "--prefill") {
            ok = int_arg(argc, argv, i, prefill);
        } else if (arg == "--no-repack") {
            repack = false;
        } else if (arg == "--maps" && i + 1 < argc) {
            maps = argv[++i];
        } else if (path.empty() && arg[0] != '-') {
            path = arg;
        } else {
            ok = false;
        }
        if (!ok) {
            return fail("bad argument '" + arg + "'; usage: peer-count MODEL.gguf [--threads N] [--prompt N] "
                        "[--steps N] [--prefill N] [--no-repack] [--maps FILE]");
        }
    }
    if (path.empty()) {
        return fail("no GGUF file given; usage: peer-count MODEL.gguf [...]");
    }
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model_params mparams = llama_model_default_params();
    mparams.use_extra_bufts = repack;  // llama.cpp's repacked weights (its default), or vec_dot
    mparams.load_mode = LLAMA_LOAD_MODE_NONE;  // read at load, not faulted in during a counted phase
    llama_model * model = llama_model_load_from_file(path.c_str(), mparams);
    if (model == nullptr) {
        return fail("llama.cpp refused the GGUF file " + path + " (its log line is above)");
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    if (n_vocab <= 0) {
        return fail(path + " has no vocabulary size (a no_vocab GGUF needs the ARCH.vocab_size key)");
    }
    llama_context_params cparams = llama_context_default_params();
    const int longest = prompt + steps > prefill ? prompt + steps : prefill;
    cparams.n_ctx = static_cast<uint32_t>(longest + 16);
    cparams.n_batch = cparams.n_ubatch = static_cast<uint32_t>(longest > 1 ? longest : 1);
    cparams.n_threads = cparams.n_threads_batch = threads;
    cparams.no_perf = true;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (ctx == nullptr) {
        return fail("llama.cpp could not make a context for " + path);
    }
    std::mt19937 rng(0);
    std::uniform_int_distribution<int> draw(0, n_vocab - 1);
    std::vector<llama_token> tokens(prompt);
    for (auto & t : tokens) {
        t = draw(rng);
    }
    std::vector<llama_token> decoded;
    mark(1);
    if (llama_decode(ctx, llama_batch_get_one(tokens.data(), prompt)) != 0) {
        return fail("the prompt's prefill failed");
    }
    mark(2);
    for (int step = 0; step < steps; ++step) {
        // Greedy, as the guest picks: the argmax of the last row's logits.
        const float * logits = llama_get_logits_ith(ctx, -1);
        llama_token best = 0;
        for (int v = 1; v < n_vocab; ++v) {
            if (logits[v] > logits[best]) {
                best = v;
            }
        }
        decoded.push_back(best);
        if (llama_decode(ctx, llama_batch_get_one(&decoded.back(), 1)) != 0) {
            return fail("decode step " + std::to_string(step + 1) + " failed");
        }
        mark(3 + step);
    }
    int next = 3 + steps;
    if (prefill > 0) {
        llama_memory_clear(llama_get_memory(ctx), true);
        std::vector<llama_token> batch(prefill);
        for (auto & t : batch) {
            t = draw(rng);
        }
        mark(next);
        if (llama_decode(ctx, llama_batch_get_one(batch.data(), prefill)) != 0) {
            return fail("the " + std::to_string(prefill) + "-token prefill failed");
        }
        mark(next + 1);
    }
    if (!maps.empty()) {
        std::ifstream in("/proc/self/maps");
        std::ofstream out(maps);
        out << in.rdbuf();
        if (!out.good()) {
            return fail("could not write the maps file " + maps);
        }
    }
    std::printf("{\"tokens\": [");
    for (size_t i = 0; i < decoded.size(); ++i) {
        std::printf("%s%d", i ? ", " : "", decoded[i]);
    }
    std::printf("], \"threads\": %d, \"prompt\": %d, \"steps\": %d, \"prefill\": %d, \"repack\": %s, "
                "\"n_vocab\": %d}\n", threads, prompt, steps, prefill, repack ? "true" : "false", n_vocab);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
