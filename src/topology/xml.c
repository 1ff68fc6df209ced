/* SPDX-License-Identifier: Apache-2.0 */
#include "core.h"
#include "topology/xml.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Every attribute costs a whole struct xml_attr (320 bytes) however short
 * it is in the text, so a 16 MiB file of `a="" b="" ...` could otherwise
 * ask for about 1 GiB. Real topologies have a few thousand at most. */
#define XML_MAX_ATTRS_TOTAL (1 << 20)

static int name_start(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' || c == ':';
}
static int name_char(unsigned char c) {
  return name_start(c) || (c >= '0' && c <= '9') || c == '.' || c == '-';
}
static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static int name_ok(const char *s) {
  if (s == NULL || !name_start((unsigned char)s[0]))
    return 0;
  size_t n = 1;
  while (s[n] && name_char((unsigned char)s[n]))
    n++;
  return s[n] == '\0' && n < XML_NAME_MAX;
}

/* A printable excerpt of a caller's string for a message: the sentence is
 * shown to users and logged, so it must not carry control bytes. */
static const char *excerpt(const char *s, size_t max, char *buf, size_t len) {
  size_t n = 0;
  for (; s && s[n] && n < max && n + 4 < len; n++)
    buf[n] = ((unsigned char)s[n] >= 0x20 && (unsigned char)s[n] < 0x7f) ? s[n] : '?';
  buf[n] = '\0';
  if (s && s[n])
    snprintf(buf + n, len - n, "...");
  return buf;
}

/* The public struct has no capacity field, so the capacity is implied by
 * the count: 4, then the next power of two. Counts only ever drop below it
 * (a detached child), which keeps the real allocation at least that big. */
static int grow(void **arr, int n, size_t elem) {
  if (n != 0 && (n < 4 || (n & (n - 1)) != 0))
    return 0;
  if (n > INT_MAX / 2)
    return -1;
  size_t cap = n == 0 ? 4 : (size_t)n * 2;
  void *p = realloc(*arr, cap * elem);
  if (p == NULL)
    return -1;
  *arr = p;
  return 0;
}

static struct xml_node *node_alloc(struct xml_node *parent, const char *name) {
  struct xml_node *n = calloc(1, sizeof *n);
  if (n == NULL)
    return NULL;
  snprintf(n->name, sizeof n->name, "%s", name);
  if (parent) {
    if (grow((void **)&parent->children, parent->nchildren, sizeof *parent->children) != 0) {
      free(n);
      return NULL;
    }
    parent->children[parent->nchildren++] = n;
    n->parent = parent;
  }
  return n;
}

static int attr_push(struct xml_node *node, const char *name, const char *value) {
  if (grow((void **)&node->attrs, node->nattrs, sizeof *node->attrs) != 0)
    return -1;
  struct xml_attr *a = &node->attrs[node->nattrs++];
  snprintf(a->name, sizeof a->name, "%s", name);
  snprintf(a->value, sizeof a->value, "%s", value);
  return 0;
}

void xml_free(struct xml_node *node) {
  if (node == NULL)
    return;
  struct xml_node *p = node->parent;
  if (p) {
    for (int i = 0; i < p->nchildren; i++) {
      if (p->children[i] == node) {
        memmove(&p->children[i], &p->children[i + 1], (size_t)(p->nchildren - i - 1) * sizeof *p->children);
        p->nchildren--;
        break;
      }
    }
    node->parent = NULL;
  }
  /* Without recursion: trees built in memory have no depth limit. Each
   * step unlinks the last child, so the walk back up finds fewer left. */
  struct xml_node *n = node;
  while (n) {
    if (n->nchildren > 0) {
      n = n->children[--n->nchildren];
      continue;
    }
    struct xml_node *up = n->parent;
    free(n->attrs);
    free(n->children);
    free(n);
    n = up;
  }
}

ncclResult_t xml_new(struct xml_node *parent, const char *name, struct xml_node **out) {
  char ex[80];
  if (out == NULL)
    return err_set(ncclInvalidArgument, "xml_new: no place for the result");
  *out = NULL;
  if (!name_ok(name))
    return err_set(ncclInvalidArgument, "invalid XML element name \"%s\"", excerpt(name, 64, ex, sizeof ex));
  struct xml_node *n = node_alloc(parent, name);
  if (n == NULL)
    return err_set(ncclSystemError, "out of memory for the XML element <%s>", name);
  *out = n;
  return ncclSuccess;
}

const char *xml_get(const struct xml_node *node, const char *attr) {
  if (node == NULL || attr == NULL)
    return NULL;
  for (int i = 0; i < node->nattrs; i++)
    if (strcmp(node->attrs[i].name, attr) == 0)
      return node->attrs[i].value;
  return NULL;
}

ncclResult_t xml_set(struct xml_node *node, const char *attr, const char *value) {
  char ex[80];
  if (node == NULL || attr == NULL || value == NULL)
    return err_set(ncclInvalidArgument, "xml_set: NULL element, attribute or value");
  if (!name_ok(attr))
    return err_set(ncclInvalidArgument, "invalid XML attribute name \"%s\" on <%s>",
                   excerpt(attr, 64, ex, sizeof ex), node->name);
  size_t vlen = strlen(value);
  if (vlen >= XML_VALUE_MAX)
    return err_set(ncclInvalidArgument, "value of attribute \"%s\" on <%s> is longer than %d characters", attr,
                   node->name, XML_VALUE_MAX - 1);
  for (int i = 0; i < node->nattrs; i++) {
    if (strcmp(node->attrs[i].name, attr) == 0) {
      memmove(node->attrs[i].value, value, vlen + 1);
      return ncclSuccess;
    }
  }
  if (node->nattrs >= XML_MAX_ATTRS)
    return err_set(ncclInvalidArgument, "element <%s> would have more than %d attributes", node->name,
                   XML_MAX_ATTRS);
  if (attr_push(node, attr, value) != 0)
    return err_set(ncclSystemError, "out of memory for an attribute of the XML element <%s>", node->name);
  return ncclSuccess;
}

/* ---- Reading ------------------------------------------------------------
 * One pass over the bytes with the open elements as the stack (each node's
 * parent pointer), so nesting costs no C stack whatever the input. Nodes
 * join the tree as soon as they are named: freeing the root on any error
 * frees everything. */

struct parser {
  const char *p, *end;
  const char *src;
  int line;
  int depth; /* open elements */
  int nodes;
  long attrs;
  struct xml_node *root, *cur;
};

static ncclResult_t perr(struct parser *ps, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static ncclResult_t perr(struct parser *ps, int line, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return err_set(ncclInvalidArgument, "%s line %d: %s", ps->src, line, what);
}

static ncclResult_t oom(struct parser *ps) {
  return err_set(ncclSystemError, "%s line %d: out of memory", ps->src, ps->line);
}

/* What is at the cursor, for "expected X, found Y". */
static const char *found(const struct parser *ps, char *buf, size_t len) {
  if (ps->p >= ps->end)
    return "the end of the file";
  unsigned char c = (unsigned char)*ps->p;
  if (c == 0)
    snprintf(buf, len, "a NUL byte");
  else if (c < 0x20 || c == 0x7f)
    snprintf(buf, len, "control character 0x%02x", c);
  else if (c >= 0x80)
    snprintf(buf, len, "byte 0x%02x", c);
  else
    snprintf(buf, len, "\"%c\"", c);
  return buf;
}

static int at(const struct parser *ps, const char *s) {
  size_t n = strlen(s);
  return (size_t)(ps->end - ps->p) >= n && memcmp(ps->p, s, n) == 0;
}

static ncclResult_t bad_byte(struct parser *ps, unsigned char c, const char *where) {
  if (c == 0)
    return perr(ps, ps->line, "NUL byte %s", where);
  return perr(ps, ps->line, "control character 0x%02x %s", c, where);
}

static ncclResult_t skip_ws(struct parser *ps) {
  for (; ps->p < ps->end; ps->p++) {
    unsigned char c = (unsigned char)*ps->p;
    if (c == '\n')
      ps->line++;
    else if (!is_ws(c)) {
      if (c < 0x20)
        return bad_byte(ps, c, "outside an attribute value");
      break;
    }
  }
  return ncclSuccess;
}

/* Comments and processing instructions: skipped whole, lines counted. */
static ncclResult_t skip_until(struct parser *ps, const char *close, const char *what, const char *where) {
  int line0 = ps->line;
  size_t n = strlen(close);
  for (; ps->p < ps->end; ps->p++) {
    if (at(ps, close)) {
      ps->p += n;
      return ncclSuccess;
    }
    unsigned char c = (unsigned char)*ps->p;
    if (c == '\n')
      ps->line++;
    else if (c < 0x20 && c != '\t' && c != '\r')
      return bad_byte(ps, c, where);
  }
  return perr(ps, line0, "%s is not closed (end of file)", what);
}

static ncclResult_t text_error(struct parser *ps) {
  char snip[40];
  size_t n = 0;
  const char *q = ps->p;
  for (; q < ps->end && n < 24 && *q != '<' && !is_ws((unsigned char)*q) && (unsigned char)*q >= 0x20; q++)
    snip[n++] = (unsigned char)*q < 0x7f ? *q : '?';
  snip[n] = '\0';
  const char *more = (n == 24 && q < ps->end && *q != '<' && !is_ws((unsigned char)*q)) ? "..." : "";
  if (ps->root == NULL)
    return perr(ps, ps->line, "unexpected text \"%s%s\" before the root element", snip, more);
  if (ps->cur == NULL)
    return perr(ps, ps->line, "unexpected text \"%s%s\" after the root element <%s>", snip, more, ps->root->name);
  return perr(ps, ps->line, "unexpected text \"%s%s\" between elements (inside <%s>)", snip, more, ps->cur->name);
}

static ncclResult_t parse_name(struct parser *ps, char *out, const char *kind, const char *after) {
  char f[32];
  if (ps->p >= ps->end || !name_start((unsigned char)*ps->p))
    return perr(ps, ps->line, "expected an %s name %s, found %s", kind, after, found(ps, f, sizeof f));
  size_t n = 0;
  while (ps->p < ps->end && name_char((unsigned char)*ps->p)) {
    if (n == XML_NAME_MAX - 1)
      return perr(ps, ps->line, "%s name \"%.20s...\" longer than %d characters", kind, out, XML_NAME_MAX - 1);
    out[n++] = *ps->p++;
    out[n] = '\0';
  }
  return ncclSuccess;
}

static ncclResult_t parse_entity(struct parser *ps, const char *attr, char *out) {
  static const struct {
    const char *text;
    char c;
  } ents[] = {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}};
  for (size_t i = 0; i < sizeof ents / sizeof ents[0]; i++) {
    if (at(ps, ents[i].text)) {
      ps->p += strlen(ents[i].text);
      *out = ents[i].c;
      return ncclSuccess;
    }
  }
  const char *q = ps->p + 1;
  while (q < ps->end && q - ps->p < 12 && (name_char((unsigned char)*q) || *q == '#'))
    q++;
  if (q < ps->end && *q == ';')
    return perr(ps, ps->line, "unknown entity \"%.*s;\" in the value of attribute \"%s\" (only &amp; &lt; &gt; &quot; &apos;)",
                (int)(q - ps->p), ps->p, attr);
  return perr(ps, ps->line, "\"&\" in the value of attribute \"%s\" does not start an entity (write &amp;)", attr);
}

static ncclResult_t parse_attr(struct parser *ps, struct xml_node *node) {
  int line0 = ps->line;
  char f[32], name[XML_NAME_MAX], value[XML_VALUE_MAX];
  if (!name_start((unsigned char)*ps->p))
    return perr(ps, line0, "expected an attribute name, \">\" or \"/>\" in <%s>, found %s", node->name,
                found(ps, f, sizeof f));
  CHECK(parse_name(ps, name, "attribute", ""));
  CHECK(skip_ws(ps));
  if (ps->p == ps->end || *ps->p != '=')
    return perr(ps, line0, "attribute \"%s\" has no value", name);
  ps->p++;
  CHECK(skip_ws(ps));
  if (ps->p == ps->end || *ps->p == '>' || *ps->p == '/')
    return perr(ps, line0, "attribute \"%s\" has no value", name);
  if (*ps->p != '"' && *ps->p != '\'')
    return perr(ps, ps->line, "value of attribute \"%s\" is not quoted (found %s)", name, found(ps, f, sizeof f));
  char quote = *ps->p++;
  size_t n = 0;
  for (;;) {
    if (ps->p == ps->end)
      return perr(ps, line0, "value of attribute \"%s\" is not closed (end of file)", name);
    char c = *ps->p;
    if (c == quote) {
      ps->p++;
      break;
    }
    if (c == '\0')
      return perr(ps, ps->line, "NUL byte in the value of attribute \"%s\"", name);
    if (c == '<')
      return perr(ps, ps->line, "\"<\" inside the value of attribute \"%s\" (write &lt;)", name);
    if (c == '&') {
      CHECK(parse_entity(ps, name, &c));
    } else {
      if (c == '\n')
        ps->line++;
      ps->p++;
    }
    if (n == XML_VALUE_MAX - 1)
      return perr(ps, ps->line, "attribute value longer than %d characters (attribute \"%s\")", XML_VALUE_MAX - 1,
                  name);
    value[n++] = c;
  }
  value[n] = '\0';
  for (int i = 0; i < node->nattrs; i++)
    if (strcmp(node->attrs[i].name, name) == 0)
      return perr(ps, line0, "attribute \"%s\" appears twice in <%s>", name, node->name);
  if (node->nattrs == XML_MAX_ATTRS)
    return perr(ps, line0, "element <%s> has more than %d attributes", node->name, XML_MAX_ATTRS);
  if (ps->attrs == XML_MAX_ATTRS_TOTAL)
    return perr(ps, line0, "more than %d attributes in the document", XML_MAX_ATTRS_TOTAL);
  if (attr_push(node, name, value) != 0)
    return oom(ps);
  ps->attrs++;
  return ncclSuccess;
}

static ncclResult_t start_tag(struct parser *ps) {
  int line0 = ps->line;
  char f[32], name[XML_NAME_MAX];
  ps->p++;
  CHECK(parse_name(ps, name, "element", "after \"<\""));
  if (ps->root && ps->cur == NULL)
    return perr(ps, line0, "second root element <%s> (a document has one root; <%s> is on line %d)", name,
                ps->root->name, ps->root->line);
  if (ps->depth == XML_MAX_DEPTH)
    return perr(ps, line0, "more than %d nested elements", XML_MAX_DEPTH);
  if (ps->nodes == XML_MAX_NODES)
    return perr(ps, line0, "more than %d elements", XML_MAX_NODES);
  struct xml_node *node = node_alloc(ps->cur, name);
  if (node == NULL)
    return oom(ps);
  node->line = line0;
  ps->nodes++;
  if (ps->root == NULL)
    ps->root = node;
  for (;;) {
    const char *before = ps->p;
    CHECK(skip_ws(ps));
    if (ps->p == ps->end)
      return perr(ps, line0, "start tag <%s> is not closed (end of file)", name);
    if (*ps->p == '>') {
      ps->p++;
      ps->cur = node;
      ps->depth++;
      return ncclSuccess;
    }
    if (*ps->p == '/') {
      ps->p++;
      if (ps->p < ps->end && *ps->p == '>') {
        ps->p++;
        return ncclSuccess;
      }
      return perr(ps, ps->line, "expected \">\" after \"/\" in <%s>, found %s", name, found(ps, f, sizeof f));
    }
    if (ps->p == before)
      return perr(ps, ps->line, "expected whitespace, \">\" or \"/>\" in <%s>, found %s", name, found(ps, f, sizeof f));
    CHECK(parse_attr(ps, node));
  }
}

static ncclResult_t end_tag(struct parser *ps) {
  int line0 = ps->line;
  char f[32], name[XML_NAME_MAX];
  ps->p += 2;
  CHECK(parse_name(ps, name, "element", "after \"</\""));
  CHECK(skip_ws(ps));
  if (ps->p == ps->end || *ps->p != '>')
    return perr(ps, ps->line, "expected \">\" to end the closing tag </%s>, found %s", name, found(ps, f, sizeof f));
  ps->p++;
  if (ps->root == NULL)
    return perr(ps, line0, "closing tag </%s> before any element", name);
  if (ps->cur == NULL)
    return perr(ps, line0, "closing tag </%s> after the root element <%s> closed", name, ps->root->name);
  if (strcmp(name, ps->cur->name) != 0)
    return perr(ps, line0, "closing tag </%s> does not match <%s> opened on line %d", name, ps->cur->name,
                ps->cur->line);
  ps->cur = ps->cur->parent;
  ps->depth--;
  return ncclSuccess;
}

static ncclResult_t parse_doc(struct parser *ps) {
  /* Some editors start UTF-8 files with a byte order mark. */
  if (at(ps, "\xef\xbb\xbf"))
    ps->p += 3;
  for (;;) {
    CHECK(skip_ws(ps));
    if (ps->p == ps->end)
      break;
    if (*ps->p != '<')
      return text_error(ps);
    if (at(ps, "<!--")) {
      ps->p += 4;
      CHECK(skip_until(ps, "-->", "comment", "in a comment"));
    } else if (at(ps, "<?")) {
      if (ps->root)
        return perr(ps, ps->line, "processing instruction \"<?\" after the root element started (only before it)");
      ps->p += 2;
      CHECK(skip_until(ps, "?>", "processing instruction", "in a processing instruction"));
    } else if (at(ps, "<!DOCTYPE")) {
      return perr(ps, ps->line, "document type declarations (<!DOCTYPE) are not supported");
    } else if (at(ps, "<![CDATA[")) {
      return perr(ps, ps->line, "CDATA sections are not supported (elements have no text)");
    } else if (at(ps, "<!")) {
      return perr(ps, ps->line, "unexpected \"<!\" (only <!-- comments --> are allowed)");
    } else if (at(ps, "</")) {
      CHECK(end_tag(ps));
    } else {
      CHECK(start_tag(ps));
    }
  }
  if (ps->cur)
    return perr(ps, ps->cur->line, "element <%s> is not closed (end of file)", ps->cur->name);
  if (ps->root == NULL)
    return perr(ps, ps->line, "no root element (end of file)");
  return ncclSuccess;
}

ncclResult_t xml_parse(const char *text, size_t len, const char *source, struct xml_node **root) {
  if (root == NULL)
    return err_set(ncclInvalidArgument, "xml_parse: no place for the result");
  *root = NULL;
  if (source == NULL)
    source = "XML";
  if (text == NULL && len > 0)
    return err_set(ncclInvalidArgument, "%s: no text to parse", source);
  if (text == NULL)
    text = ""; /* NULL + 0 is undefined */
  if (len > XML_MAX_BYTES)
    return err_set(ncclInvalidArgument, "%s: document is larger than %u MiB", source, XML_MAX_BYTES >> 20);
  struct parser ps = {.p = text, .end = text + len, .src = source, .line = 1};
  ncclResult_t res = parse_doc(&ps);
  if (res != ncclSuccess) {
    xml_free(ps.root);
    return res;
  }
  *root = ps.root;
  return ncclSuccess;
}

ncclResult_t xml_parse_file(const char *path, const char *source, struct xml_node **root) {
  if (root == NULL || path == NULL)
    return err_set(ncclInvalidArgument, "xml_parse_file: NULL path or result");
  *root = NULL;
  if (source == NULL)
    source = path;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return err_set(ncclSystemError, "%s: cannot open %s: %s", source, path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return err_set(ncclSystemError, "%s: cannot stat %s: %s", source, path, strerror(e));
  }
  if (st.st_size > (off_t)XML_MAX_BYTES) {
    close(fd);
    return err_set(ncclInvalidArgument, "%s: file is larger than %u MiB", source, XML_MAX_BYTES >> 20);
  }
  /* Read to the end rather than trust the size: a pipe has none, and a
   * file may grow between fstat and read. */
  size_t cap = S_ISREG(st.st_mode) ? (size_t)st.st_size + 1 : 65536, len = 0;
  char *buf = malloc(cap);
  ncclResult_t res = ncclSuccess;
  if (buf == NULL) {
    close(fd);
    return err_set(ncclSystemError, "%s: out of memory for %zu bytes", source, cap);
  }
  for (;;) {
    if (len == cap) {
      char *nb = realloc(buf, cap * 2);
      if (nb == NULL) {
        res = err_set(ncclSystemError, "%s: out of memory for %zu bytes", source, cap * 2);
        goto out;
      }
      buf = nb;
      cap *= 2;
    }
    ssize_t n = read(fd, buf + len, cap - len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      res = err_set(ncclSystemError, "%s: cannot read %s: %s", source, path, strerror(errno));
      goto out;
    }
    if (n == 0)
      break;
    len += (size_t)n;
    if (len > XML_MAX_BYTES) {
      res = err_set(ncclInvalidArgument, "%s: file is larger than %u MiB", source, XML_MAX_BYTES >> 20);
      goto out;
    }
  }
  res = xml_parse(buf, len, source, root);
out:
  free(buf);
  close(fd);
  return res;
}

/* ---- Writing ------------------------------------------------------------
 * Refuses what the reader would refuse (bad names, duplicates, too deep,
 * too many), so that whatever is written reads back as the same tree. */

struct outbuf {
  char *p;
  size_t len, cap;
  int oom, big;
};

static void put(struct outbuf *b, const char *s, size_t n) {
  if (b->oom || b->big)
    return;
  if (b->len + n > XML_MAX_BYTES) {
    b->big = 1;
    return;
  }
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n + 1)
      cap *= 2;
    char *p = realloc(b->p, cap);
    if (p == NULL) {
      b->oom = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void puts_(struct outbuf *b, const char *s) { put(b, s, strlen(s)); }

static void put_indent(struct outbuf *b, int depth) {
  static const char spaces[] = "                                ";
  for (int n = depth * 2; n > 0; n -= (int)sizeof spaces - 1)
    put(b, spaces, (size_t)LOOM_MIN(n, (int)sizeof spaces - 1));
}

static void put_value(struct outbuf *b, const char *v) {
  while (*v) {
    size_t run = strcspn(v, "&<>\"");
    put(b, v, run);
    v += run;
    switch (*v) {
    case '&': puts_(b, "&amp;"); break;
    case '<': puts_(b, "&lt;"); break;
    case '>': puts_(b, "&gt;"); break;
    case '"': puts_(b, "&quot;"); break;
    default: return;
    }
    v++;
  }
}

static ncclResult_t check_node(const struct xml_node *n) {
  char ex[80];
  if (!name_ok(n->name))
    return err_set(ncclInvalidArgument, "cannot write XML: invalid element name \"%s\"",
                   excerpt(n->name, 64, ex, sizeof ex));
  if (n->nattrs < 0 || n->nattrs > XML_MAX_ATTRS || n->nchildren < 0 || (n->nattrs && !n->attrs) ||
      (n->nchildren && !n->children))
    return err_set(ncclInvalidArgument, "cannot write XML: element <%s> has a corrupt attribute or child list",
                   n->name);
  for (int i = 0; i < n->nattrs; i++) {
    const struct xml_attr *a = &n->attrs[i];
    if (!name_ok(a->name) || memchr(a->value, '\0', sizeof a->value) == NULL)
      return err_set(ncclInvalidArgument, "cannot write XML: element <%s> has an invalid attribute \"%s\"", n->name,
                     excerpt(a->name, 64, ex, sizeof ex));
    for (int j = 0; j < i; j++)
      if (strcmp(n->attrs[j].name, a->name) == 0)
        return err_set(ncclInvalidArgument, "cannot write XML: attribute \"%s\" appears twice in <%s>", a->name,
                       n->name);
  }
  for (int i = 0; i < n->nchildren; i++)
    if (n->children[i] == NULL)
      return err_set(ncclInvalidArgument, "cannot write XML: element <%s> has a NULL child", n->name);
  return ncclSuccess;
}

static ncclResult_t put_open(struct outbuf *b, const struct xml_node *n, int depth, int *count) {
  if (++*count > XML_MAX_NODES)
    return err_set(ncclInvalidArgument, "cannot write XML: more than %d elements", XML_MAX_NODES);
  CHECK(check_node(n));
  put_indent(b, depth);
  put(b, "<", 1);
  puts_(b, n->name);
  for (int i = 0; i < n->nattrs; i++) {
    put(b, " ", 1);
    puts_(b, n->attrs[i].name);
    put(b, "=\"", 2);
    put_value(b, n->attrs[i].value);
    put(b, "\"", 1);
  }
  puts_(b, n->nchildren ? ">\n" : "/>\n");
  return ncclSuccess;
}

ncclResult_t xml_write(const struct xml_node *root, char **text, size_t *len) {
  if (root == NULL || text == NULL)
    return err_set(ncclInvalidArgument, "xml_write: NULL tree or result");
  *text = NULL;
  if (len)
    *len = 0;
  struct outbuf b = {0};
  struct {
    const struct xml_node *node;
    int next;
  } st[XML_MAX_DEPTH];
  int sp = 0, count = 0;
  ncclResult_t res;
  puts_(&b, "<?xml version=\"1.0\"?>\n");
  CHECK_GOTO(put_open(&b, root, 0, &count), res, fail);
  if (root->nchildren) {
    st[0].node = root;
    st[0].next = 0;
    sp = 1;
  }
  while (sp > 0) {
    const struct xml_node *n = st[sp - 1].node;
    if (st[sp - 1].next == n->nchildren) {
      sp--;
      put_indent(&b, sp);
      put(&b, "</", 2);
      puts_(&b, n->name);
      put(&b, ">\n", 2);
      continue;
    }
    const struct xml_node *c = n->children[st[sp - 1].next++];
    if (sp == XML_MAX_DEPTH) {
      res = err_set(ncclInvalidArgument, "cannot write XML: more than %d nested elements (<%s> under <%s>)",
                    XML_MAX_DEPTH, c->name, n->name);
      goto fail;
    }
    CHECK_GOTO(put_open(&b, c, sp, &count), res, fail);
    if (c->nchildren) {
      st[sp].node = c;
      st[sp].next = 0;
      sp++;
    }
  }
  if (b.oom) {
    res = err_set(ncclSystemError, "out of memory writing XML");
    goto fail;
  }
  if (b.big) {
    res = err_set(ncclInvalidArgument, "cannot write XML: the text would be larger than %u MiB", XML_MAX_BYTES >> 20);
    goto fail;
  }
  *text = b.p;
  if (len)
    *len = b.len;
  return ncclSuccess;
fail:
  free(b.p);
  return res;
}

ncclResult_t xml_write_file(const struct xml_node *root, const char *path) {
  if (path == NULL)
    return err_set(ncclInvalidArgument, "xml_write_file: NULL path");
  char *text;
  size_t len;
  CHECK(xml_write(root, &text, &len));
  ncclResult_t res = ncclSuccess;
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    res = err_set(ncclSystemError, "cannot create %s: %s", path, strerror(errno));
    goto out;
  }
  for (size_t off = 0; off < len;) {
    ssize_t n = write(fd, text + off, len - off);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      res = err_set(ncclSystemError, "cannot write %s: %s", path, strerror(errno));
      break;
    }
    off += (size_t)n;
  }
  /* A full disk may only show at close on some file systems. */
  if (close(fd) != 0 && res == ncclSuccess)
    res = err_set(ncclSystemError, "cannot write %s: %s", path, strerror(errno));
out:
  free(text);
  return res;
}
