/* A folder-per-label tree to text rows: ROOT/LABEL/FILE, each regular file one row whose
 * label is its folder's name. Folders and files are taken in byte order of their names
 * (so the rows' order does not depend on the file system); names starting with '.' are
 * left out, as are files directly under ROOT. A file that is not UTF-8 is an error naming
 * it, or with skip_invalid is counted and left out. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/file_bytes.h"
#include "datasets/folder_names.h"
#include "datasets/text_rows.h"
#include "datasets/utf8.h"

int tg_text_read_folders(const char *root, int skip_invalid, tg_text_rows *rows, tg_err *err) {
    size_t rlen = strlen(root);
    while (rlen > 1 && root[rlen - 1] == '/') rlen--; /* "data/" names files as "data/x/y" */
    char base[4096];
    if (rlen >= sizeof base) return tg_fail(err, "%s: path too long", root);
    memcpy(base, root, rlen);
    base[rlen] = 0;
    tg_folder_names labels;
    if (tg_folder_list(base, 1, &labels, err)) return -1;
    if (labels.n == 0) {
        tg_folder_names_free(&labels);
        return tg_fail(err, "%s: no label folders (the layout is %s/LABEL/FILE, one folder per label)", base, base);
    }
    int rc = 0;
    char dir[4096], path[8192];
    for (size_t i = 0; i < labels.n && !rc; i++) {
        /* GCOVR_EXCL_BR_START: list() fit this same path in a buffer of this size */
        if (snprintf(dir, sizeof dir, "%s/%s", base, labels.v[i]) >= (int)sizeof dir) {
            /* GCOVR_EXCL_BR_STOP */
            rc = tg_fail(err, "%s/%s: path too long", base, labels.v[i]);
            break;
        }
        if (tg_utf8_invalid_at(labels.v[i], strlen(labels.v[i])) >= 0) {
            rc = tg_fail(err, "%s: the folder's name is not UTF-8, so it cannot name a label", dir);
            break;
        }
        tg_folder_names files;
        if ((rc = tg_folder_list(dir, 0, &files, err))) break;
        for (size_t j = 0; j < files.n && !rc; j++) {
            /* GCOVR_EXCL_BR_START: dir is under 4096 bytes and a name under 256, so the path fits */
            if (snprintf(path, sizeof path, "%s/%s", dir, files.v[j]) >= (int)sizeof path) {
                /* GCOVR_EXCL_BR_STOP */
                rc = tg_fail(err, "%s/%s: path too long", dir, files.v[j]);
                break;
            }
            char *text;
            size_t len;
            if ((rc = tg_file_bytes(path, &text, &len, err))) break;
            int64_t bad = tg_utf8_invalid_at(text, len);
            if (bad >= 0 && skip_invalid) {
                rows->skipped_invalid++;
            } else if (bad >= 0) {
                rc = tg_fail(err, "%s: not valid UTF-8 (byte 0x%02x at offset %lld; re-encode the file as UTF-8, or "
                                  "pass --skip-invalid to leave such files out)",
                             path, (unsigned char)text[bad], (long long)bad);
            } else {
                int32_t source;
                rc = tg_text_rows_source(rows, path, &source, err) ||
                     tg_text_rows_add(rows, source, 0, text, len, NULL, 0, labels.v[i], strlen(labels.v[i]), err);
            }
            free(text);
        }
        tg_folder_names_free(&files);
    }
    tg_folder_names_free(&labels);
    return rc ? -1 : 0;
}
