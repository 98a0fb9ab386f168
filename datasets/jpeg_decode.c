/* JPEG through libjpeg-turbo, from memory. libjpeg reports errors through its error
 * manager, which jumps back here; the reader's state lives on the heap, so no local
 * changes between setjmp and the jump. Its warnings (data cut short, corrupt data
 * skipped) are errors too: the pixels they leave are not the image's. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jerror.h>
#include <jpeglib.h>

#include "base/alloc.h"
#include "datasets/image_decode.h"

/* A progressive file may hold many scans, each a pass over the whole image: past this many
 * it is refused rather than decoded for minutes (libjpeg-turbo's own fuzzers limit them
 * likewise). */
#define MAX_SCANS 500

typedef struct jpeg_reader {
    struct jpeg_error_mgr mgr; /* first, so the manager's pointer is the reader's */
    struct jpeg_progress_mgr progress;
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX + 64]; /* the error, as said after "NAME: " */
    uint8_t *pixels;                /* freed by the caller on an error */
    int32_t channels, height, width;
} jpeg_reader;

static void jump_with(j_common_ptr cinfo, const char *what) {
    jpeg_reader *r = (jpeg_reader *)cinfo->err;
    char text[JMSG_LENGTH_MAX];
    cinfo->err->format_message(cinfo, text);
    snprintf(r->msg, sizeof r->msg, "%s: %s", what, text);
    longjmp(r->jump, 1);
}

static void on_error(j_common_ptr cinfo) { jump_with(cinfo, "corrupt JPEG"); }

/* Level -1 is a warning; 0 and up are trace messages, which say nothing is wrong. */
static void on_message(j_common_ptr cinfo, int level) {
    if (level >= 0) return;
    jump_with(cinfo, cinfo->err->msg_code == JWRN_JPEG_EOF ? "truncated JPEG" : "corrupt JPEG");
}

static void on_progress(j_common_ptr cinfo) {
    const j_decompress_ptr d = (j_decompress_ptr)cinfo;
    if (d->input_scan_number > MAX_SCANS) {
        jpeg_reader *r = (jpeg_reader *)cinfo->err;
        snprintf(r->msg, sizeof r->msg, "JPEG of more than %d scans", MAX_SCANS);
        longjmp(r->jump, 1);
    }
}

/* Everything libjpeg may jump out of. */
static void decode(j_decompress_ptr d, jpeg_reader *r, const uint8_t *buf, size_t len) {
    jpeg_mem_src(d, buf, (unsigned long)len);
    jpeg_read_header(d, TRUE);
    const int64_t w = d->image_width, h = d->image_height;
    if (w * h > TG_IMAGE_MAX_PIXELS) {
        snprintf(r->msg, sizeof r->msg, "%lld x %lld pixels, more than the %lld an image may have", (long long)w,
                 (long long)h, (long long)TG_IMAGE_MAX_PIXELS);
        longjmp(r->jump, 1);
    }
    switch (d->jpeg_color_space) {
    case JCS_GRAYSCALE: d->out_color_space = JCS_GRAYSCALE; break;
    case JCS_YCbCr:
    case JCS_RGB: d->out_color_space = JCS_RGB; break;
    default:
        /* CMYK and YCCK: libjpeg does not turn them into RGB. */
        snprintf(r->msg, sizeof r->msg, "a JPEG of %d colour components that are not gray or RGB (CMYK?): "
                                        "save it as RGB",
                 d->num_components);
        longjmp(r->jump, 1);
    }
    jpeg_start_decompress(d);
    const int32_t channels = d->output_components;
    const size_t stride = (size_t)d->output_width * (size_t)channels;
    r->pixels = tg_malloc(stride * d->output_height);
    if (!r->pixels) {
        snprintf(r->msg, sizeof r->msg, "out of memory for its pixels");
        longjmp(r->jump, 1);
    }
    while (d->output_scanline < d->output_height) {
        JSAMPROW row = r->pixels + (size_t)d->output_scanline * stride;
        jpeg_read_scanlines(d, &row, 1);
    }
    jpeg_finish_decompress(d);
    r->channels = channels, r->height = (int32_t)d->output_height, r->width = (int32_t)d->output_width;
}

int tg_jpeg_decode(const uint8_t *buf, size_t len, const char *name, tg_image *out, tg_err *err) {
    memset(out, 0, sizeof *out);
    if (len < 3 || buf[0] != 0xff || buf[1] != 0xd8 || buf[2] != 0xff)
        return tg_fail(err, "%s: not a JPEG file (it does not start with ff d8 ff)", name);
    jpeg_reader *r = tg_calloc(1, sizeof *r);
    struct jpeg_decompress_struct *d = tg_calloc(1, sizeof *d);
    if (!r || !d) {
        free(r);
        free(d);
        return tg_fail(err, "%s: out of memory", name);
    }
    d->err = jpeg_std_error(&r->mgr);
    r->mgr.error_exit = on_error;
    r->mgr.emit_message = on_message;
    int rc = 0;
    if (setjmp(r->jump)) {
        rc = tg_fail(err, "%s: %s", name, r->msg);
        free(r->pixels);
    } else {
        jpeg_create_decompress(d);
        r->progress.progress_monitor = on_progress;
        d->progress = &r->progress;
        decode(d, r, buf, len);
        *out = (tg_image){r->channels, r->height, r->width, r->pixels};
    }
    jpeg_destroy_decompress(d); /* safe on a struct jpeg_create_decompress never set up: it is zeroed */
    free(d);
    free(r);
    return rc;
}
