/* Hugging Face config.json -> tg_model_config. Presets are config files in
 * models/presets/<name>/config.json, so a preset and a downloaded folder share one path. */
#ifndef TUNEGRAPH_MODEL_CONFIG_H
#define TUNEGRAPH_MODEL_CONFIG_H

#include "base/error.h"
#include "plan/plan.h"

/* source: a preset name (see tg_presets_dir) or a folder holding config.json and,
 * optionally, model.safetensors (recorded in cfg->weights). */
int tg_model_config_load(const char *source, tg_model_config *cfg, tg_err *err);

/* Parses one config.json. Errors name the file and the field. */
int tg_model_config_parse(const char *config_json_path, tg_model_config *cfg, tg_err *err);

/* The presets folder: $TUNEGRAPH_PRESETS if set, else the one compiled in. */
const char *tg_presets_dir(void);

#endif
