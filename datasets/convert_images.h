/* Image shard sets for `data convert` (datasets/convert.h has the options and report):
 *   idx      MNIST's IDX images file and labels file (datasets/idx.h), plain or gzip'd
 *            (told by the first bytes, 1f 8b), one channel
 *   images   ROOT/LABEL/FILE: a folder per label of PNG and JPEG files (told by their
 *            first bytes, not their names; datasets/image_decode.h), decoded to
 *            image_channels (1 or 3; default 3) channels. The labels are the folders'
 *            names, ordered as the text converters order labels (datasets/labels.h: by
 *            value when every name is a whole number, else by bytes); each folder's files
 *            in byte order of their names; names starting with '.', files directly under
 *            ROOT and folders inside the label folders are left out. Without image_size
 *            every image must have the first one's size.
 * Both resize each image to image_size x image_size when given (bilinear, as torchvision's
 * Resize with antialias off) and write one record per image: the label and the pixels as
 * channel planes (CHW). The writer works in a temporary folder and renames it into place on
 * success, so a failed conversion leaves no set behind. */
#ifndef TUNEGRAPH_CONVERT_IMAGES_H
#define TUNEGRAPH_CONVERT_IMAGES_H

#include "base/error.h"
#include "datasets/convert.h"

int tg_convert_idx(const tg_convert_options *o, tg_convert_report *rep, tg_err *err);
int tg_convert_image_folders(const tg_convert_options *o, tg_convert_report *rep, tg_err *err);

#endif
