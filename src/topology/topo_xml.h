/* A topology to and from XML (NCCL_TOPO_FILE, NCCL_TOPO_DUMP_FILE).
 * SPDX-License-Identifier: Apache-2.0 */
#ifndef LOOM_TOPO_XML_H
#define LOOM_TOPO_XML_H

#include "nccl.h"
#include "topology/graph.h"
#include "topology/xml.h"

/* Builds the graph (paths computed) from a parsed document; `source`
 * names it in errors, which give the line. */
ncclResult_t topo_from_xml(const struct xml_node *root, const char *source, struct topo_system **out);
ncclResult_t topo_to_xml(const struct topo_system *s, struct xml_node **out);
ncclResult_t topo_load(const char *path, struct topo_system **out);
ncclResult_t topo_dump(const struct topo_system *s, const char *path);

#endif
