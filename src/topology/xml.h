/*
 * A small XML reader and writer for topology files (NCCL_TOPO_FILE,
 * NCCL_TOPO_DUMP_FILE): elements with attributes, nested; no text content.
 * Hostile input (truncated, huge, nonsense) is refused with a sentence that
 * names the source and the line, never a crash.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_XML_H
#define LOOM_XML_H

#include <stddef.h>

#include "nccl.h"

#define XML_NAME_MAX 64     /* element and attribute names, with the NUL */
#define XML_VALUE_MAX 256   /* attribute values, with the NUL */
#define XML_MAX_DEPTH 64
#define XML_MAX_NODES 65536
#define XML_MAX_ATTRS 64
#define XML_MAX_BYTES (16u << 20)

struct xml_attr {
  char name[XML_NAME_MAX];
  char value[XML_VALUE_MAX];
};

struct xml_node {
  char name[XML_NAME_MAX];
  struct xml_attr *attrs;
  int nattrs;
  struct xml_node **children;
  int nchildren;
  struct xml_node *parent;
  int line; /* where it starts in its source, 1-based; 0 if built in memory */
};

/* Parses `len` bytes of `text`; `source` names it in error messages
 * ("NCCL_TOPO_FILE=/path"). The document must have exactly one root
 * element; an <?xml ...?> prolog and <!-- comments --> are allowed;
 * whitespace between elements is ignored and any other text is an error.
 * Attribute values may be quoted with ' or " and use the five predefined
 * entities (&amp; &lt; &gt; &quot; &apos;). On failure ncclInvalidArgument
 * (ncclSystemError for I/O) with "<source> line N: <what>". */
ncclResult_t xml_parse(const char *text, size_t len, const char *source, struct xml_node **root);
ncclResult_t xml_parse_file(const char *path, const char *source, struct xml_node **root);

/* A new element (the root when parent is NULL). */
ncclResult_t xml_new(struct xml_node *parent, const char *name, struct xml_node **out);
void xml_free(struct xml_node *node);

/* The attribute's value, or NULL when absent. */
const char *xml_get(const struct xml_node *node, const char *attr);
/* Sets (adds or replaces) an attribute; refuses names and values too long. */
ncclResult_t xml_set(struct xml_node *node, const char *attr, const char *value);

/* Serialises with two-space indentation, one element per line, attributes
 * in their order, values escaped; the text is malloc'ed and NUL-ended. */
ncclResult_t xml_write(const struct xml_node *root, char **text, size_t *len);
ncclResult_t xml_write_file(const struct xml_node *root, const char *path);

#endif
