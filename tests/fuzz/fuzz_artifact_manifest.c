/* libFuzzer target: an artifact's manifest.json (cli/artifact_manifest.c). What it accepts
 * names the run or sweep command and lists distinct relative paths inside the folder (no
 * '/' first, no empty, '.' or '..' part, not manifest.json), each with its size; what it
 * refuses comes with a message and leaves nothing allocated. */
#include <string.h>

#include "cli/artifact_manifest.h"
#include "tests/fuzz/fuzz_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    artifact_manifest m;
    tg_err err = {{0}};
    if (artifact_manifest_parse("manifest.json", (const char *)data, size, &m, &err)) {
        FUZZ_ASSERT(err.msg[0] && m.n_files == 0 && !m.files, "refused without a message, or with files left");
        return 0;
    }
    FUZZ_ASSERT(!strcmp(m.command, "run") || !strcmp(m.command, "sweep"), "command '%s'", m.command);
    FUZZ_ASSERT(m.n_files >= 0 && m.n_files <= ARTIFACT_FILES_MAX && m.n_absent >= 0, "%d files", m.n_files);
    for (int i = 0; i < m.n_files; i++) {
        const char *p = m.files[i].path;
        FUZZ_ASSERT(artifact_path_ok(p) && p[0] != '/' && !strstr(p, "//") && strcmp(p, "manifest.json"), "path %d", i);
        FUZZ_ASSERT(strcmp(p, "..") && strncmp(p, "../", 3) && !strstr(p, "/../"), "path %d climbs out", i);
        FUZZ_ASSERT(artifact_manifest_find(&m, p) == &m.files[i], "path %d listed twice", i);
    }
    FUZZ_ASSERT(strlen(m.job_xxh64) == 0 || strlen(m.job_xxh64) == 16, "job hash '%s'", m.job_xxh64);
    artifact_manifest_free(&m);
    return 0;
}
