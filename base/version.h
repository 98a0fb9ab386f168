/* The version every artifact records: plan fingerprints, `tunegraph version`. */
#ifndef TUNEGRAPH_VERSION_H
#define TUNEGRAPH_VERSION_H

#define TG_VERSION_STRING "tunegraph 0.2.0"

#endif
