/* libFuzzer target: Hugging Face config.json (tg_model_config_parse). */
#include "models/model_config.h"
#include "tests/fuzz/fuzz_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_input_file(data, size);
    tg_model_config cfg;
    tg_err err;
    if (tg_model_config_parse(path, &cfg, &err) == 0) {
        /* What the compiler relies on from a parsed config. */
        FUZZ_ASSERT(cfg.arch >= 0 && cfg.arch < TG_ARCH_COUNT, "arch %d", cfg.arch);
        if (cfg.arch == TG_ARCH_MOBILENET_V2) {
            /* An image model: no tokens, its image fields in range. */
            FUZZ_ASSERT((cfg.image_channels == 1 || cfg.image_channels == 3) && cfg.image_size >= 1 &&
                            cfg.image_size <= 4096 && cfg.width_mult > 0 && cfg.width_mult <= 16 &&
                            cfg.batch_norm_momentum >= 0 && cfg.batch_norm_momentum <= 1 && cfg.layer_norm_eps > 0,
                        "channels %d size %d width %g momentum %g eps %g", cfg.image_channels, cfg.image_size,
                        cfg.width_mult, cfg.batch_norm_momentum, cfg.layer_norm_eps);
        } else {
            FUZZ_ASSERT(cfg.vocab_size > 0 && cfg.hidden > 0 && cfg.layers > 0 && cfg.heads > 0 &&
                            cfg.intermediate > 0 && cfg.max_positions > 0,
                        "vocab %d hidden %d layers %d heads %d intermediate %d positions %d", cfg.vocab_size,
                        cfg.hidden, cfg.layers, cfg.heads, cfg.intermediate, cfg.max_positions);
            FUZZ_ASSERT(cfg.hidden % cfg.heads == 0, "hidden %d heads %d", cfg.hidden, cfg.heads);
            FUZZ_ASSERT(cfg.pad_token_id < cfg.vocab_size, "pad %d vocab %d", cfg.pad_token_id, cfg.vocab_size);
        }
    } else {
        FUZZ_ASSERT(err.msg[0], "failed without a message");
    }
    return 0;
}
