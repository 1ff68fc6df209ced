/* The XML reader and writer of topology files: structure and lines, round
 * trips, every refusal with its sentence, the limits, files, and a bounded
 * fuzz over mutated documents. The tests, as listed in test_list.h:

UNIT_TEST(unit_xml_topology, 30)
UNIT_TEST(unit_xml_round_trip, 30)
UNIT_TEST(unit_xml_entities, 30)
UNIT_TEST(unit_xml_prolog_comments, 30)
UNIT_TEST(unit_xml_malformed, 30)
UNIT_TEST(unit_xml_limits, 30)
UNIT_TEST(unit_xml_build, 30)
UNIT_TEST(unit_xml_file, 30)
UNIT_TEST(unit_xml_fuzz, 30)
*/
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core.h"
#include "topology/xml.h"
#include "test.h"

#define SRC "NCCL_TOPO_FILE=/tmp/x.xml"

static const char topo_doc[] =
    "<?xml version=\"1.0\"?>\n"
    "<!-- an NCCL-style topology -->\n"
    "<system version=\"1\">\n"
    "  <cpu numaid=\"0\" affinity=\"0-3\">\n"
    "    <pci busid=\"0000:15:00.0\" class=\"0x060400\" link_speed=\"32.0 GT/s PCIe\" link_width=\"16\">\n"
    "      <gpu dev=\"0\" sm=\"90\">\n"
    "        <nvlink target=\"0000:05:00.0\" count=\"18\" tclass=\"0x068000\"/>\n"
    "      </gpu>\n"
    "    </pci>\n"
    "  </cpu>\n"
    "  <cpu numaid='1' affinity='4-7'>\n"
    "    <pci busid=\"0000:45:00.0\"\n"
    "         class=\"0x020000\" link_width=\"16\">\n"
    "      <nic>\n"
    "        <net name=\"mlx5_0\" dev=\"0\" speed=\"200000\" port=\"1\" gdr=\"1\"/>\n"
    "      </nic>\n"
    "    </pci>\n"
    "  </cpu>\n"
    "</system>\n";

static struct xml_node *parse_ok(const char *text) {
  struct xml_node *root = NULL;
  ncclResult_t r = xml_parse(text, strlen(text), SRC, &root);
  ASSERT_MSG(r == ncclSuccess, "parse failed (%d): %s", (int)r, err_thread_last());
  ASSERT(root != NULL);
  return root;
}

static int trees_equal(const struct xml_node *a, const struct xml_node *b) {
  if (strcmp(a->name, b->name) != 0 || a->nattrs != b->nattrs || a->nchildren != b->nchildren)
    return 0;
  for (int i = 0; i < a->nattrs; i++)
    if (strcmp(a->attrs[i].name, b->attrs[i].name) != 0 || strcmp(a->attrs[i].value, b->attrs[i].value) != 0)
      return 0;
  for (int i = 0; i < a->nchildren; i++)
    if (a->children[i]->parent != a || b->children[i]->parent != b || !trees_equal(a->children[i], b->children[i]))
      return 0;
  return 1;
}

/* Writes, reads back and compares; returns the written text. */
static char *round_trip(const struct xml_node *root) {
  char *text = NULL;
  size_t len = 0;
  ASSERT_MSG(xml_write(root, &text, &len) == ncclSuccess, "write: %s", err_thread_last());
  ASSERT(text != NULL && strlen(text) == len);
  struct xml_node *again = NULL;
  ASSERT_MSG(xml_parse(text, len, "written", &again) == ncclSuccess, "reparse: %s\n%s", err_thread_last(), text);
  ASSERT(trees_equal(root, again));
  xml_free(again);
  return text;
}

TEST_IMPL(unit_xml_topology) {
  struct xml_node *sys = parse_ok(topo_doc);
  ASSERT(strcmp(sys->name, "system") == 0 && sys->parent == NULL && sys->line == 3);
  ASSERT(sys->nattrs == 1 && strcmp(xml_get(sys, "version"), "1") == 0);
  ASSERT(sys->nchildren == 2);
  struct xml_node *cpu0 = sys->children[0], *cpu1 = sys->children[1];
  ASSERT(strcmp(cpu0->name, "cpu") == 0 && cpu0->line == 4 && cpu0->parent == sys);
  ASSERT(strcmp(xml_get(cpu0, "numaid"), "0") == 0 && strcmp(xml_get(cpu0, "affinity"), "0-3") == 0);
  ASSERT(xml_get(cpu0, "busid") == NULL);
  ASSERT(cpu0->nchildren == 1);
  struct xml_node *pci = cpu0->children[0];
  ASSERT(strcmp(pci->name, "pci") == 0 && pci->line == 5 && pci->nattrs == 4);
  /* In the document's order. */
  ASSERT(strcmp(pci->attrs[0].name, "busid") == 0 && strcmp(pci->attrs[0].value, "0000:15:00.0") == 0);
  ASSERT(strcmp(pci->attrs[1].name, "class") == 0 && strcmp(pci->attrs[1].value, "0x060400") == 0);
  ASSERT(strcmp(pci->attrs[2].name, "link_speed") == 0 && strcmp(pci->attrs[2].value, "32.0 GT/s PCIe") == 0);
  ASSERT(strcmp(pci->attrs[3].name, "link_width") == 0 && strcmp(pci->attrs[3].value, "16") == 0);
  ASSERT(pci->nchildren == 1);
  struct xml_node *gpu = pci->children[0];
  ASSERT(strcmp(gpu->name, "gpu") == 0 && gpu->line == 6 && gpu->parent == pci);
  ASSERT(strcmp(xml_get(gpu, "dev"), "0") == 0 && strcmp(xml_get(gpu, "sm"), "90") == 0);
  ASSERT(gpu->nchildren == 1);
  struct xml_node *nvl = gpu->children[0];
  ASSERT(strcmp(nvl->name, "nvlink") == 0 && nvl->line == 7 && nvl->nchildren == 0 && nvl->nattrs == 3);
  ASSERT(strcmp(xml_get(nvl, "target"), "0000:05:00.0") == 0);
  ASSERT(strcmp(xml_get(nvl, "count"), "18") == 0 && strcmp(xml_get(nvl, "tclass"), "0x068000") == 0);
  /* Single quotes, and a tag spread over two lines starts on its first. */
  ASSERT(cpu1->line == 11 && strcmp(xml_get(cpu1, "affinity"), "4-7") == 0);
  struct xml_node *pci1 = cpu1->children[0];
  ASSERT(pci1->line == 12 && strcmp(xml_get(pci1, "class"), "0x020000") == 0);
  struct xml_node *net = pci1->children[0]->children[0];
  ASSERT(strcmp(pci1->children[0]->name, "nic") == 0 && pci1->children[0]->line == 14);
  ASSERT(strcmp(net->name, "net") == 0 && net->line == 15 && strcmp(xml_get(net, "name"), "mlx5_0") == 0);
  ASSERT(strcmp(xml_get(net, "gdr"), "1") == 0 && net->nattrs == 5);
  xml_free(sys);
  return 0;
}

TEST_IMPL(unit_xml_round_trip) {
  struct xml_node *sys = parse_ok(topo_doc);
  char *text = round_trip(sys);
  static const char expect_head[] =
      "<?xml version=\"1.0\"?>\n"
      "<system version=\"1\">\n"
      "  <cpu numaid=\"0\" affinity=\"0-3\">\n"
      "    <pci busid=\"0000:15:00.0\" class=\"0x060400\" link_speed=\"32.0 GT/s PCIe\" link_width=\"16\">\n"
      "      <gpu dev=\"0\" sm=\"90\">\n"
      "        <nvlink target=\"0000:05:00.0\" count=\"18\" tclass=\"0x068000\"/>\n"
      "      </gpu>\n"
      "    </pci>\n"
      "  </cpu>\n"
      "  <cpu numaid=\"1\" affinity=\"4-7\">\n"
      "    <pci busid=\"0000:45:00.0\" class=\"0x020000\" link_width=\"16\">\n";
  ASSERT_MSG(strncmp(text, expect_head, strlen(expect_head)) == 0, "got:\n%s", text);
  ASSERT(strcmp(text + strlen(text) - 10, "</system>\n") == 0);
  /* Writing what was read back gives the same text: a fixed point. */
  struct xml_node *again = parse_ok(text);
  char *text2 = round_trip(again);
  ASSERT(strcmp(text, text2) == 0);
  free(text);
  free(text2);
  xml_free(again);
  xml_free(sys);

  /* Values that need escaping survive. */
  struct xml_node *r = parse_ok("<a q='say \"hi\" &amp; &lt;go&gt; it&apos;s' n=\"line1\nline2\tx\"/>");
  ASSERT(strcmp(xml_get(r, "q"), "say \"hi\" & <go> it's") == 0);
  ASSERT(strcmp(xml_get(r, "n"), "line1\nline2\tx") == 0);
  text = round_trip(r);
  ASSERT_MSG(strstr(text, "q=\"say &quot;hi&quot; &amp; &lt;go&gt; it's\" n=\"line1\nline2\tx\"/>") != NULL, "%s", text);
  free(text);
  xml_free(r);
  return 0;
}

TEST_IMPL(unit_xml_entities) {
  struct xml_node *r =
      parse_ok("<a v=\"&amp;&lt;&gt;&quot;&apos;\" w='&quot;' x=\"a&amp;b\" e=\"\" s='&lt;x/&gt;'/>");
  ASSERT(strcmp(xml_get(r, "v"), "&<>\"'") == 0);
  ASSERT(strcmp(xml_get(r, "w"), "\"") == 0);
  ASSERT(strcmp(xml_get(r, "x"), "a&b") == 0);
  ASSERT(strcmp(xml_get(r, "e"), "") == 0);
  ASSERT(strcmp(xml_get(r, "s"), "<x/>") == 0);
  xml_free(r);
  /* Bytes above 0x7f pass through untouched, in values and comments. */
  r = parse_ok("<!-- caf\xc3\xa9 --><a v=\"caf\xc3\xa9 \xff\"/>");
  ASSERT(strcmp(xml_get(r, "v"), "caf\xc3\xa9 \xff") == 0);
  xml_free(r);
  /* An entity counts as one character towards the value limit. */
  char big[XML_VALUE_MAX * 6 + 32];
  int n = snprintf(big, sizeof big, "<a v=\"");
  for (int i = 0; i < XML_VALUE_MAX - 1; i++)
    n += snprintf(big + n, sizeof big - (size_t)n, "&amp;");
  snprintf(big + n, sizeof big - (size_t)n, "\"/>");
  r = parse_ok(big);
  ASSERT(strlen(xml_get(r, "v")) == XML_VALUE_MAX - 1);
  xml_free(r);
  return 0;
}

TEST_IMPL(unit_xml_prolog_comments) {
  struct xml_node *r = parse_ok("\xef\xbb\xbf<?xml version=\"1.0\" encoding=\"UTF-8\"?>\r\n"
                                "<!-- one -->\r\n<!---->\n"
                                "<a>\n  <!-- <b> inside a comment is not an element -->\n"
                                "  <c x=\"1\"/>\n<!--\nmulti\nline\n-->\n  <d/>\n</a>\n<!-- trailing -->\n  \n");
  ASSERT(strcmp(r->name, "a") == 0 && r->line == 4 && r->nchildren == 2);
  ASSERT(strcmp(r->children[0]->name, "c") == 0 && r->children[0]->line == 6);
  ASSERT(strcmp(r->children[1]->name, "d") == 0 && r->children[1]->line == 11);
  xml_free(r);
  /* Whitespace around "=" and before ">" is fine; so are odd name characters. */
  r = parse_ok("<_a:b.c-d  x = 'y'\n\t z\n=\n\"w\"  ></_a:b.c-d  >");
  ASSERT(strcmp(r->name, "_a:b.c-d") == 0 && strcmp(xml_get(r, "x"), "y") == 0 && strcmp(xml_get(r, "z"), "w") == 0);
  xml_free(r);
  return 0;
}

struct bad {
  const char *text;
  size_t len; /* 0: strlen */
  int line;   /* 0: the sentence has no line */
  const char *words[3];
};

static const struct bad bad_docs[] = {
    {"<system>\n<cpu>\n<pci>\n", 0, 3, {"element <pci> is not closed (end of file)"}},
    {"<system>\n<cpu busid/>\n</system>", 0, 2, {"attribute \"busid\" has no value"}},
    {"<system>\n<cpu busid=/>\n</system>", 0, 2, {"attribute \"busid\" has no value"}},
    {"<system>\n<cpu busid>\n</system>", 0, 2, {"attribute \"busid\" has no value"}},
    {"<a>\n<b/>abc\n</a>", 0, 2, {"unexpected text \"abc\" between elements"}},
    {"<system>\n<pci>\n\n</cpu>\n</system>", 0, 4, {"closing tag </cpu> does not match <pci> opened on line 2"}},
    {"<a>\n<b x=\"&foo;\"/></a>", 0, 2, {"unknown entity \"&foo;\"", "\"x\""}},
    {"<a x=\"&#60;\"/>", 0, 1, {"unknown entity \"&#60;\""}},
    {"<a x=\"a & b\"/>", 0, 1, {"\"&\"", "does not start an entity"}},
    {"<a x=\"&amp\"/>", 0, 1, {"does not start an entity"}},
    {"<a>\n\n<b x=\"a<b\"/></a>", 0, 3, {"\"<\" inside the value of attribute \"x\""}},
    {"", 0, 1, {"no root element"}},
    {"<?xml version=\"1.0\"?>\n<!-- nothing -->\n", 0, 3, {"no root element"}},
    {"<a/>\n<b/>", 0, 2, {"second root element <b>"}},
    {"<a></a>\n\n<a></a>", 0, 3, {"second root element <a>"}},
    {"<a/>\nxyz", 0, 2, {"unexpected text \"xyz\" after the root element"}},
    {"<a/>\n</a>", 0, 2, {"closing tag </a> after the root element"}},
    {"hello <a/>", 0, 1, {"unexpected text \"hello\" before the root element"}},
    {"</a>", 0, 1, {"closing tag </a> before any element"}},
    {"<a>\n\0</a>", 9, 2, {"NUL byte"}},
    {"<a x=\"1\0\"/>", 11, 1, {"NUL byte", "value of attribute \"x\""}},
    {"<a>\n\x01</a>", 0, 2, {"control character 0x01"}},
    {"<a\x07 b=\"1\"/>", 0, 1, {"control character 0x07"}},
    {"<a b\x1b=\"1\"/>", 0, 1, {"control character 0x1b"}},
    {"<!-- \x02 -->\n<a/>", 0, 1, {"control character 0x02", "comment"}},
    {"<\x01" "a/>", 0, 1, {"expected an element name", "control character 0x01"}},
    {"<a x=\"1\" x=\"2\"/>", 0, 1, {"attribute \"x\" appears twice in <a>"}},
    {"<a x=1/>", 0, 1, {"value of attribute \"x\" is not quoted"}},
    {"<a>\n<b x=\"1 />\n", 0, 2, {"value of attribute \"x\" is not closed (end of file)"}},
    {"<a x='1\"/>", 0, 1, {"is not closed (end of file)"}},
    {"<a/>\n<!-- foo\n\n", 0, 2, {"comment is not closed (end of file)"}},
    {"<?xml version=\"1.0\"\n<a/>", 0, 1, {"processing instruction is not closed"}},
    {"<a><?pi x?></a>", 0, 1, {"processing instruction"}},
    {"<1a/>", 0, 1, {"expected an element name after \"<\", found \"1\""}},
    {"< a/>", 0, 1, {"expected an element name"}},
    {"<>", 0, 1, {"expected an element name"}},
    {"<a 9x=\"1\"/>", 0, 1, {"expected an attribute name", "found \"9\""}},
    {"<a \"x\"/>", 0, 1, {"expected an attribute name"}},
    {"<a x=\"1\"y=\"2\"/>", 0, 1, {"expected whitespace", "found \"y\""}},
    {"<a/ >", 0, 1, {"expected \">\" after \"/\""}},
    {"<a></a x>", 0, 1, {"expected \">\" to end the closing tag </a>"}},
    {"<a></>", 0, 1, {"expected an element name after \"</\""}},
    {"<a>\n<b x=\"1\"", 0, 2, {"start tag <b> is not closed (end of file)"}},
    {"<a", 0, 1, {"start tag <a> is not closed (end of file)"}},
    {"<", 0, 1, {"expected an element name", "end of the file"}},
    {"<!DOCTYPE a>\n<a/>", 0, 1, {"DOCTYPE"}},
    {"<a><![CDATA[x]]></a>", 0, 1, {"CDATA"}},
    {"<a><!ELEMENT a></a>", 0, 1, {"unexpected \"<!\""}},
    {"<a>\xc3\xa9</a>", 0, 1, {"unexpected text \"??\" between elements"}},
    {"<a x=\"1\" y=\"2\">text that goes on and on and on</a>", 0, 1, {"unexpected text \"text\""}},
    {"<a>\n<b/>\n</a  \n", 0, 4, {"expected \">\" to end the closing tag </a>", "end of the file"}},
    {"<a>\n<b>\n</c>\n</a>", 0, 3, {"closing tag </c> does not match <b> opened on line 2"}},
};

static void expect_bad(const char *text, size_t len, int line, const char *const words[3], int idx) {
  struct xml_node *root = (struct xml_node *)&root; /* must be reset */
  /* An exact copy, so that reading one byte too far shows under ASan. */
  char *copy = malloc(len ? len : 1);
  ASSERT(copy != NULL);
  memcpy(copy, text, len);
  err_clear();
  ncclResult_t r = xml_parse(copy, len, SRC, &root);
  free(copy);
  const char *msg = err_thread_last();
  ASSERT_MSG(r == ncclInvalidArgument, "case %d: returned %d (%s)", idx, (int)r, msg);
  ASSERT_MSG(root == NULL, "case %d: root not reset", idx);
  char prefix[64];
  if (line)
    snprintf(prefix, sizeof prefix, SRC " line %d: ", line);
  else
    snprintf(prefix, sizeof prefix, SRC ": ");
  ASSERT_MSG(strncmp(msg, prefix, strlen(prefix)) == 0, "case %d: wanted prefix \"%s\", got \"%s\"", idx, prefix, msg);
  for (int i = 0; i < 3 && words[i]; i++)
    ASSERT_MSG(strstr(msg, words[i]) != NULL, "case %d: \"%s\" not in \"%s\"", idx, words[i], msg);
  for (const char *c = msg; *c; c++)
    ASSERT_MSG((unsigned char)*c >= 0x20 && (unsigned char)*c < 0x7f, "case %d: raw byte in \"%s\"", idx, msg);
}

TEST_IMPL(unit_xml_malformed) {
  for (size_t i = 0; i < sizeof bad_docs / sizeof bad_docs[0]; i++) {
    const struct bad *b = &bad_docs[i];
    expect_bad(b->text, b->len ? b->len : strlen(b->text), b->line, b->words, (int)i);
  }
  /* Lines keep counting through values, comments and tags over lines. */
  const char *words[3] = {"element <b> is not closed"};
  const char *lines = "<a x=\"1\n2\"\n>\n<!-- \n\n -->\n<b y='\n'>";
  expect_bad(lines, strlen(lines), 7, words, -1);
  /* Source defaults when not given; a NULL result pointer is refused. */
  ASSERT(xml_parse("x", 1, NULL, &(struct xml_node *){NULL}) == ncclInvalidArgument);
  ASSERT(strncmp(err_thread_last(), "XML line 1: ", 12) == 0);
  ASSERT(xml_parse("<a/>", 4, SRC, NULL) == ncclInvalidArgument);
  return 0;
}

static char *repeat(const char *head, const char *unit, int n, const char *tail) {
  size_t hl = strlen(head), ul = strlen(unit), tl = strlen(tail);
  char *s = malloc(hl + ul * (size_t)n + tl + 1);
  ASSERT(s != NULL);
  memcpy(s, head, hl);
  for (int i = 0; i < n; i++)
    memcpy(s + hl + ul * (size_t)i, unit, ul);
  memcpy(s + hl + ul * (size_t)n, tail, tl + 1);
  return s;
}

static char *nested(int depth) {
  char *s = malloc((size_t)depth * 12 + 1), *p = s;
  ASSERT(s != NULL);
  for (int i = 0; i < depth; i++)
    p += sprintf(p, "<e>\n");
  for (int i = 0; i < depth; i++)
    p += sprintf(p, "</e>");
  return s;
}

TEST_IMPL(unit_xml_limits) {
  const char *w[3] = {NULL};
  struct xml_node *r;
  /* Depth: 64 nested elements are fine, the 65th is refused where it opens. */
  char *s = nested(XML_MAX_DEPTH);
  r = parse_ok(s);
  free(round_trip(r));
  xml_free(r);
  free(s);
  s = nested(XML_MAX_DEPTH + 1);
  w[0] = "more than 64 nested elements";
  expect_bad(s, strlen(s), XML_MAX_DEPTH + 1, w, -1);
  free(s);
  s = repeat("", "<e>", 100000, "");
  expect_bad(s, strlen(s), 1, w, -1);
  free(s);

  /* Elements: 65536 in all (the root and 65535 children), then no more. */
  s = repeat("<a>", "<b/>", XML_MAX_NODES - 1, "</a>");
  r = parse_ok(s);
  ASSERT(r->nchildren == XML_MAX_NODES - 1);
  free(round_trip(r));
  xml_free(r);
  free(s);
  s = repeat("<a>", "<b/>", XML_MAX_NODES, "</a>");
  w[0] = "more than 65536 elements";
  expect_bad(s, strlen(s), 1, w, -1);
  free(s);

  /* Values: 255 characters, not 256. */
  char v[XML_VALUE_MAX + 1];
  memset(v, 'v', sizeof v);
  v[XML_VALUE_MAX - 1] = '\0';
  char doc[2 * XML_VALUE_MAX];
  snprintf(doc, sizeof doc, "<a\nv=\"%s\"/>", v);
  r = parse_ok(doc);
  ASSERT(strlen(xml_get(r, "v")) == XML_VALUE_MAX - 1);
  xml_free(r);
  v[XML_VALUE_MAX - 1] = 'v';
  v[XML_VALUE_MAX] = '\0';
  snprintf(doc, sizeof doc, "<a\nv=\"%s\"/>", v);
  w[0] = "attribute value longer than 255 characters";
  expect_bad(doc, strlen(doc), 2, w, -1);

  /* Names: 63 characters, not 64. */
  char name[XML_NAME_MAX + 1];
  memset(name, 'n', sizeof name);
  name[XML_NAME_MAX - 1] = '\0';
  snprintf(doc, sizeof doc, "<%s %s=\"1\"/>", name, name);
  r = parse_ok(doc);
  ASSERT(strcmp(r->name, name) == 0 && xml_get(r, name) != NULL);
  xml_free(r);
  name[XML_NAME_MAX - 1] = 'n';
  name[XML_NAME_MAX] = '\0';
  snprintf(doc, sizeof doc, "<%s/>", name);
  w[0] = "element name";
  w[1] = "longer than 63 characters";
  expect_bad(doc, strlen(doc), 1, w, -1);
  snprintf(doc, sizeof doc, "<a %s=\"1\"/>", name);
  w[0] = "attribute name";
  expect_bad(doc, strlen(doc), 1, w, -1);
  w[1] = NULL;

  /* Attributes: 64 on one element, not 65. */
  char *many = malloc(16 * (XML_MAX_ATTRS + 2) + 8), *p = many;
  p += sprintf(p, "<a");
  for (int i = 0; i < XML_MAX_ATTRS; i++)
    p += sprintf(p, " a%d=\"%d\"", i, i);
  sprintf(p, "/>");
  r = parse_ok(many);
  ASSERT(r->nattrs == XML_MAX_ATTRS && strcmp(xml_get(r, "a63"), "63") == 0);
  free(round_trip(r));
  xml_free(r);
  sprintf(p, " a64=\"64\"/>");
  w[0] = "element <a> has more than 64 attributes";
  expect_bad(many, strlen(many), 1, w, -1);
  free(many);

  /* Size: 16 MiB is read, one byte more is refused before looking. */
  size_t big = XML_MAX_BYTES;
  s = malloc(big + 1);
  ASSERT(s != NULL);
  memset(s, ' ', big + 1);
  memcpy(s, "<a/>", 4);
  struct xml_node *root = NULL;
  ASSERT_OK(xml_parse(s, big, SRC, &root));
  xml_free(root);
  w[0] = "document is larger than 16 MiB";
  expect_bad(s, big + 1, 0, w, -1);
  free(s);
  return 0;
}

TEST_IMPL(unit_xml_build) {
  struct xml_node *sys, *cpu, *pci, *gpu;
  ASSERT_OK(xml_new(NULL, "system", &sys));
  ASSERT(sys->line == 0 && sys->parent == NULL);
  ASSERT_OK(xml_set(sys, "version", "1"));
  ASSERT_OK(xml_new(sys, "cpu", &cpu));
  ASSERT_OK(xml_set(cpu, "numaid", "0"));
  ASSERT_OK(xml_set(cpu, "affinity", "0-3"));
  ASSERT_OK(xml_new(cpu, "pci", &pci));
  ASSERT_OK(xml_set(pci, "busid", "0000:15:00.0"));
  ASSERT_OK(xml_new(pci, "gpu", &gpu));
  ASSERT_OK(xml_set(gpu, "dev", "0"));
  ASSERT_OK(xml_set(gpu, "dev", "1")); /* replaces, keeps its place */
  ASSERT_OK(xml_set(gpu, "sm", "90"));
  ASSERT(gpu->nattrs == 2 && strcmp(xml_get(gpu, "dev"), "1") == 0 && strcmp(gpu->attrs[0].name, "dev") == 0);
  ASSERT_OK(xml_set(gpu, "note", "a<b & \"c\" > 'd'"));
  ASSERT(cpu->parent == sys && sys->children[0] == cpu && pci->parent == cpu && gpu->parent == pci);

  char *text;
  size_t len;
  ASSERT_OK(xml_write(sys, &text, &len));
  static const char expect[] = "<?xml version=\"1.0\"?>\n"
                               "<system version=\"1\">\n"
                               "  <cpu numaid=\"0\" affinity=\"0-3\">\n"
                               "    <pci busid=\"0000:15:00.0\">\n"
                               "      <gpu dev=\"1\" sm=\"90\" note=\"a&lt;b &amp; &quot;c&quot; &gt; 'd'\"/>\n"
                               "    </pci>\n"
                               "  </cpu>\n"
                               "</system>\n";
  ASSERT_MSG(strcmp(text, expect) == 0 && len == strlen(expect), "got:\n%s", text);
  free(text);
  free(round_trip(sys));

  /* Refusals leave the tree as it was. */
  char v[XML_VALUE_MAX + 1];
  memset(v, 'x', sizeof v);
  v[XML_VALUE_MAX] = '\0';
  ASSERT(xml_set(gpu, "big", v) == ncclInvalidArgument);
  ASSERT(strstr(err_thread_last(), "longer than 255 characters") != NULL);
  v[XML_VALUE_MAX - 1] = '\0';
  ASSERT_OK(xml_set(gpu, "big", v));
  ASSERT(xml_set(gpu, "bad name", "1") == ncclInvalidArgument);
  ASSERT(strstr(err_thread_last(), "invalid XML attribute name \"bad name\"") != NULL);
  ASSERT(xml_set(gpu, "", "1") == ncclInvalidArgument);
  ASSERT(xml_set(gpu, NULL, "1") == ncclInvalidArgument && xml_set(gpu, "a", NULL) == ncclInvalidArgument);
  struct xml_node *x = (struct xml_node *)&x;
  ASSERT(xml_new(sys, "9lives", &x) == ncclInvalidArgument && x == NULL);
  ASSERT(strstr(err_thread_last(), "invalid XML element name \"9lives\"") != NULL);
  ASSERT(xml_new(sys, "a\x01", &x) == ncclInvalidArgument);
  ASSERT(strstr(err_thread_last(), "\"a?\"") != NULL);
  ASSERT(sys->nchildren == 1);
  for (int i = gpu->nattrs; i < XML_MAX_ATTRS; i++) {
    char n[16];
    snprintf(n, sizeof n, "k%d", i);
    ASSERT_OK(xml_set(gpu, n, "v"));
  }
  ASSERT(xml_set(gpu, "one_more", "v") == ncclInvalidArgument);
  ASSERT(strstr(err_thread_last(), "more than 64 attributes") != NULL);
  ASSERT_OK(xml_set(gpu, "k63", "replacing still works"));
  ASSERT(xml_get(gpu, "one_more") == NULL && xml_get(NULL, "a") == NULL);
  free(round_trip(sys));

  /* Freeing a subtree unhooks it from its parent. */
  struct xml_node *cpu2, *c;
  ASSERT_OK(xml_new(sys, "cpu2", &cpu2));
  ASSERT_OK(xml_new(sys, "cpu3", &c));
  ASSERT(sys->nchildren == 3);
  xml_free(cpu2);
  ASSERT(sys->nchildren == 2 && sys->children[0] == cpu && sys->children[1] == c);
  xml_free(cpu);
  ASSERT(sys->nchildren == 1 && sys->children[0] == c);

  /* The writer refuses what the reader would: too deep, a corrupt node. */
  struct xml_node *deep = c;
  for (int i = 0; i < XML_MAX_DEPTH - 2; i++)
    ASSERT_OK(xml_new(deep, "d", &deep));
  free(round_trip(sys)); /* 64 levels */
  ASSERT_OK(xml_new(deep, "d", &deep));
  ASSERT(xml_write(sys, &text, &len) == ncclInvalidArgument);
  ASSERT(strstr(err_thread_last(), "more than 64 nested elements") != NULL);
  /* A tree in memory may be far deeper; freeing it must not recurse. */
  for (int i = 0; i < 200000; i++)
    ASSERT_OK(xml_new(deep, "d", &deep));
  xml_free(sys);

  ASSERT_OK(xml_new(NULL, "r", &sys));
  ASSERT_OK(xml_set(sys, "a", "1"));
  snprintf(sys->attrs[0].name, sizeof sys->attrs[0].name, "x y");
  ASSERT(xml_write(sys, &text, &len) == ncclInvalidArgument);
  ASSERT(strstr(err_thread_last(), "invalid attribute") != NULL);
  snprintf(sys->attrs[0].name, sizeof sys->attrs[0].name, "a");
  ASSERT_OK(xml_set(sys, "b", "2"));
  snprintf(sys->attrs[1].name, sizeof sys->attrs[1].name, "a");
  ASSERT(xml_write(sys, &text, &len) == ncclInvalidArgument);
  ASSERT(strstr(err_thread_last(), "appears twice") != NULL);
  xml_free(sys);
  xml_free(NULL);
  return 0;
}

TEST_IMPL(unit_xml_file) {
  char dir[] = "/tmp/unit_xml_XXXXXX";
  ASSERT(mkdtemp(dir) != NULL);
  char path[128], bigpath[128], src[160];
  snprintf(path, sizeof path, "%s/topo.xml", dir);
  snprintf(bigpath, sizeof bigpath, "%s/big.xml", dir);
  snprintf(src, sizeof src, "NCCL_TOPO_FILE=%s", path);

  struct xml_node *sys = parse_ok(topo_doc), *back = NULL;
  ASSERT_OK(xml_write_file(sys, path));
  ASSERT_OK(xml_parse_file(path, src, &back));
  ASSERT(trees_equal(sys, back));
  xml_free(back);
  /* Overwriting truncates. */
  struct xml_node *small;
  ASSERT_OK(xml_new(NULL, "s", &small));
  ASSERT_OK(xml_write_file(small, path));
  ASSERT_OK(xml_parse_file(path, NULL, &back));
  ASSERT(trees_equal(small, back));
  xml_free(back);
  xml_free(small);

  /* A syntax error names the file given as the source. */
  FILE *f = fopen(path, "w");
  ASSERT(f != NULL);
  fputs("<system>\n  <cpu>\n  </gpu>\n</system>\n", f);
  fclose(f);
  back = (struct xml_node *)&back;
  ASSERT(xml_parse_file(path, src, &back) == ncclInvalidArgument && back == NULL);
  char want[256];
  snprintf(want, sizeof want, "%s line 3: closing tag </gpu> does not match <cpu> opened on line 2", src);
  ASSERT_MSG(strcmp(err_thread_last(), want) == 0, "%s", err_thread_last());

  /* A sparse file over the limit is refused from its size alone. */
  int fd = open(bigpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT(fd >= 0 && ftruncate(fd, (off_t)XML_MAX_BYTES + 1) == 0);
  close(fd);
  ASSERT(xml_parse_file(bigpath, "NCCL_TOPO_FILE=big", &back) == ncclInvalidArgument);
  ASSERT(strcmp(err_thread_last(), "NCCL_TOPO_FILE=big: file is larger than 16 MiB") == 0);

  /* I/O failures are system errors with the path and the reason. */
  char missing[160];
  snprintf(missing, sizeof missing, "%s/missing.xml", dir);
  ASSERT(xml_parse_file(missing, "NCCL_TOPO_FILE=m", &back) == ncclSystemError);
  ASSERT(strstr(err_thread_last(), "NCCL_TOPO_FILE=m: cannot open") != NULL);
  ASSERT(strstr(err_thread_last(), missing) != NULL && strstr(err_thread_last(), "No such file") != NULL);
  ASSERT(xml_parse_file(dir, NULL, &back) == ncclSystemError);
  ASSERT(strstr(err_thread_last(), "cannot read") != NULL && strstr(err_thread_last(), dir) != NULL);
  snprintf(missing, sizeof missing, "%s/no/such/dir.xml", dir);
  ASSERT(xml_write_file(sys, missing) == ncclSystemError);
  ASSERT(strstr(err_thread_last(), missing) != NULL);

  unlink(path);
  unlink(bigpath);
  rmdir(dir);
  xml_free(sys);
  return 0;
}

/* ---- Fuzz ---------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define FUZZ_CAP 8192

static void mutate(char *buf, size_t *len) {
  static const char specials[] = "<>\"=/&;'! -?\n";
  size_t n = *len;
  size_t pos = n ? rnd() % n : 0;
  switch (rnd() % 6) {
  case 0: /* flip a bit */
    if (n)
      buf[pos] ^= (char)(1u << (rnd() % 8));
    break;
  case 1: /* any byte */
    if (n)
      buf[pos] = (char)rnd();
    break;
  case 2: /* insert a character that matters to the syntax */
    if (n < FUZZ_CAP) {
      memmove(buf + pos + 1, buf + pos, n - pos);
      buf[pos] = specials[rnd() % (sizeof specials - 1)];
      n++;
    }
    break;
  case 3: /* truncate */
    n = pos;
    break;
  case 4: { /* duplicate a chunk somewhere */
    if (!n)
      break;
    size_t from = rnd() % n, clen = 1 + rnd() % 64;
    if (clen > n - from)
      clen = n - from;
    if (n + clen > FUZZ_CAP)
      break;
    char chunk[64];
    memcpy(chunk, buf + from, clen);
    memmove(buf + pos + clen, buf + pos, n - pos);
    memcpy(buf + pos, chunk, clen);
    n += clen;
    break;
  }
  case 5: /* delete a chunk */
    if (n) {
      size_t dlen = 1 + rnd() % 16;
      if (dlen > n - pos)
        dlen = n - pos;
      memmove(buf + pos, buf + pos + dlen, n - pos - dlen);
      n -= dlen;
    }
    break;
  }
  *len = n;
}

TEST_IMPL(unit_xml_fuzz) {
  static const char *seeds[] = {
      topo_doc,
      "<?xml version=\"1.0\"?>\n<!-- c -->\n<a x='1' y=\"&amp;&lt;&gt;&quot;&apos;\">\n  <b/>\n  <c z=\"\"></c>\n</a>\n",
      "<r><s><t><u v=\"w\"/></t></s></r>",
      "<net name=\"mlx5_0\" dev=\"0\" speed=\"200000\" port=\"1\" latency=\"0.000000\" guid=\"0x1\" maxconn=\"131072\" gdr=\"1\"/>",
  };
  static char buf[FUZZ_CAP + 1];
  double t0 = now();
  int iters = 0, ok = 0;
  for (; iters < 20000 && now() - t0 < 3.0; iters++) {
    const char *seed = seeds[rnd() % (sizeof seeds / sizeof seeds[0])];
    size_t len = strlen(seed);
    memcpy(buf, seed, len);
    /* Half with one mutation, so that enough still parse to exercise the
     * round trip; half with several, to get further from the seeds. */
    int muts = rnd() % 2 ? 1 : 2 + (int)(rnd() % 5);
    for (int m = 0; m < muts; m++)
      mutate(buf, &len);
    struct xml_node *root = (struct xml_node *)&root;
    char *copy = malloc(len ? len : 1); /* exact size, for ASan */
    ASSERT(copy != NULL);
    memcpy(copy, buf, len);
    err_clear();
    ncclResult_t r = xml_parse(copy, len, "fuzz", &root);
    free(copy);
    if (r == ncclSuccess) {
      ASSERT(root != NULL);
      char *text;
      size_t tlen;
      ASSERT_MSG(xml_write(root, &text, &tlen) == ncclSuccess, "iteration %d: write failed: %s", iters,
                 err_thread_last());
      struct xml_node *again = NULL;
      ASSERT_MSG(xml_parse(text, tlen, "fuzz-written", &again) == ncclSuccess, "iteration %d: reparse: %s", iters,
                 err_thread_last());
      ASSERT_MSG(trees_equal(root, again), "iteration %d: tree changed in a round trip", iters);
      xml_free(again);
      free(text);
      xml_free(root);
      ok++;
    } else {
      ASSERT_MSG(r == ncclInvalidArgument, "iteration %d: returned %d", iters, (int)r);
      ASSERT(root == NULL);
      ASSERT_MSG(strncmp(err_thread_last(), "fuzz", 4) == 0 && strlen(err_thread_last()) > 10,
                 "iteration %d: message \"%s\"", iters, err_thread_last());
    }
  }
  fprintf(stderr, "unit_xml_fuzz: %d mutated documents, %d parsed, %.2f s\n", iters, ok, now() - t0);
  ASSERT(iters >= 1000 || now() - t0 >= 3.0);
  return 0;
}
