from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from fpdf import FPDF
from hypothesis import example, given, settings
from hypothesis import strategies as st

from handrail.documents._chunker import chunk
from handrail.documents._loaders import SUPPORTED_SUFFIXES, load, load_bytes
from handrail.exceptions import DocumentLoadError

from ._corpus import VOCABULARY, assert_blocks_index_the_text, markdown, plain_text, sentence

# --- PDF ------------------------------------------------------------------------------------


def make_pdf(pages: list[list[tuple[int, str]]], **encryption: str) -> bytes:
    """A real PDF: each page a list of (font size, paragraph), paragraphs a line apart."""
    pdf = FPDF()
    pdf.set_title("Refund handbook")
    for paragraphs in pages:
        pdf.add_page()
        for size, text in paragraphs:
            pdf.set_font("Helvetica", size=size)
            pdf.multi_cell(0, size * 0.5, text)
            pdf.ln(size * 0.5)
    if encryption:
        pdf.set_encryption(**encryption)
    return bytes(pdf.output())


LONG = (
    "Customers may return any item within thirty days of delivery for a full refund to the "
    "original payment method, provided the item is unused and in its original packaging."
)
PAGES = [
    [(20, "Refund policy"), (12, LONG), (12, "Store credit is offered after thirty days.")],
    [(12, "Damaged items are refunded in full, shipping included.")],
    [(12, "A receipt, an example of proof, is needed. See hyphen-\nation and a well-\nknown case")],
]


def test_a_pdf_is_read_page_by_page_into_paragraphs(tmp_path: Path):
    path = tmp_path / "handbook.pdf"
    path.write_bytes(make_pdf(PAGES[:2]))
    document = load(path)
    assert [(b.page, b.kind, b.text) for b in document.blocks] == [
        (1, "paragraph", "Refund policy"),
        (1, "paragraph", LONG),  # wrapped lines joined with a space
        (1, "paragraph", "Store credit is offered after thirty days."),
        (2, "paragraph", "Damaged items are refunded in full, shipping included."),
    ]
    assert document.media_type == "application/pdf"
    assert document.title == "Refund handbook"
    assert_blocks_index_the_text(document)


def test_a_pdf_line_break_hyphen_is_dropped_only_for_a_word_the_document_uses():
    data = make_pdf([[(12, "Hyphenation matters. An exam-\nple and a well-\nknown rule.")]])
    document = load_bytes(data, source="h.pdf")
    # "Hyphenation" occurs elsewhere; "example" and "wellknown" do not, so they keep theirs
    assert document.text == "Hyphenation matters. An exam-ple and a well-known rule."
    data = make_pdf([[(12, "An example. Hyphen-\nation and a well-\nknown hyphenation rule.")]])
    document = load_bytes(data, source="h.pdf")
    assert document.text == "An example. Hyphenation and a well-known hyphenation rule."


def test_a_pdf_without_text_says_it_may_need_ocr():
    pdf = FPDF()
    pdf.add_page()
    pdf.rect(10, 10, 50, 50)
    with pytest.raises(DocumentLoadError, match=r"scan\.pdf: has no extractable text.*OCR") as e:
        load_bytes(bytes(pdf.output()), source="scan.pdf")
    assert e.value.source == "scan.pdf"


@pytest.mark.parametrize(
    "data",
    [b"", b"not a pdf at all", b"%PDF-1.7\n1 0 obj << /Type /Catalog", make_pdf(PAGES)[:300]],
    ids=["empty", "garbage", "header-only", "truncated"],
)
def test_a_broken_pdf_is_a_load_error_naming_the_file(data: bytes):
    with pytest.raises(DocumentLoadError, match=r"^broken\.pdf: is not a readable PDF") as e:
        load_bytes(data, source="broken.pdf")
    assert e.value.source == "broken.pdf"
    assert e.value.__cause__ is not None  # pypdf's own error stays attached for debugging


def test_a_password_protected_pdf_asks_for_a_decrypted_copy():
    data = make_pdf(PAGES[:1], owner_password="owner", user_password="secret")
    with pytest.raises(DocumentLoadError, match=r"locked\.pdf: is encrypted with a password.*qpdf"):
        load_bytes(data, source="locked.pdf")


def test_a_pdf_encrypted_without_a_user_password_is_read():
    document = load_bytes(make_pdf(PAGES[:1], owner_password="owner"), source="p.pdf")
    assert document.blocks[0].text == "Refund policy"


# --- Markdown -------------------------------------------------------------------------------

MARKDOWN = """\
# Refunds

Customers get their money back
within 30 days.

## Exceptions

| Item | Refund |
|------|--------|
| Damaged | Full |
| Opened | 50% |

```python
def refund(order):

    return order.total
```

### Perishables

- Food is final sale.
- Flowers too.

## Contact

    indented code stays code
"""


def test_markdown_blocks_keep_their_source_and_heading_path():
    document = load_bytes(MARKDOWN.encode(), source="refunds.md")
    assert document.title == "Refunds"
    assert document.media_type == "text/markdown"
    assert [(b.kind, b.headings, b.text) for b in document.blocks] == [
        ("heading", ("Refunds",), "# Refunds"),
        ("paragraph", ("Refunds",), "Customers get their money back\nwithin 30 days."),
        ("heading", ("Refunds", "Exceptions"), "## Exceptions"),
        (
            "table",
            ("Refunds", "Exceptions"),
            "| Item | Refund |\n|------|--------|\n| Damaged | Full |\n| Opened | 50% |",
        ),
        (
            "code",
            ("Refunds", "Exceptions"),
            "```python\ndef refund(order):\n\n    return order.total\n```",
        ),
        ("heading", ("Refunds", "Exceptions", "Perishables"), "### Perishables"),
        ("list", ("Refunds", "Exceptions", "Perishables"), "- Food is final sale.\n- Flowers too."),
        ("heading", ("Refunds", "Contact"), "## Contact"),  # an h2 after an h3 pops both
        ("code", ("Refunds", "Contact"), "    indented code stays code"),
    ]
    assert_blocks_index_the_text(document)


def test_markdown_heading_text_is_plain_and_the_title_is_the_first_h1():
    document = load_bytes(b"## Intro\n\ntext\n\n# The **real** `title`\n\nmore", source="a.md")
    assert document.title == "The real title"
    assert document.blocks[-1].headings == ("The real title",)


def test_markdown_front_matter_is_not_content():
    document = load_bytes(b"---\ntitle: FAQ\ntags: [a]\n---\n# FAQ\n\nAsk.", source="f.md")
    assert [b.text for b in document.blocks] == ["# FAQ", "Ask."]


# --- HTML -----------------------------------------------------------------------------------

HTML = """<!doctype html>
<html><head><title> Refund   policy </title><style>p { color: red }</style></head>
<body>
<nav><a href="/">Home</a> <a href="/shop">Shop</a></nav>
<header><h1>ACME Store</h1></header>
<main>
  <h1>Refunds</h1>
  <p>Customers   get their
     money <b>back</b> within<br>30 days.</p>
  <script>track("refund")</script>
  <h3>Fine print</h3>
  <p>Sale items are final.</p>
  <h2>Exceptions</h2>
  <ul><li>Damaged items</li><li>Wrong size <span hidden>(secret)</span></li></ul>
  <table><tr><th>Item</th><th>Refund</th></tr><tr><td>Damaged</td><td>Full</td></tr></table>
  <pre><code>refund(order)
    .confirm()</code></pre>
  <div aria-hidden="true">Screen readers skip this</div>
  <aside>Related: shipping</aside>
  <form><input name="q"><button>Search</button></form>
</main>
<footer>(c) ACME</footer>
</body></html>"""


def test_html_keeps_the_main_content_with_its_heading_path():
    document = load_bytes(HTML.encode(), source="refunds.html")
    assert document.title == "Refund policy"
    assert document.media_type == "text/html"
    assert [(b.kind, b.headings, b.text) for b in document.blocks] == [
        ("heading", ("Refunds",), "Refunds"),
        ("paragraph", ("Refunds",), "Customers get their money back within 30 days."),
        ("heading", ("Refunds", "Fine print"), "Fine print"),
        ("paragraph", ("Refunds", "Fine print"), "Sale items are final."),
        ("heading", ("Refunds", "Exceptions"), "Exceptions"),  # an h2 after an h3 pops it
        ("list", ("Refunds", "Exceptions"), "Damaged items"),
        ("list", ("Refunds", "Exceptions"), "Wrong size"),
        ("table", ("Refunds", "Exceptions"), "Item | Refund\nDamaged | Full"),
        ("code", ("Refunds", "Exceptions"), "refund(order)\n    .confirm()"),
    ]
    for dropped in ("Home", "ACME", "track", "color", "secret", "Screen", "Related", "Search"):
        assert dropped not in document.text
    assert_blocks_index_the_text(document)


def test_html_without_main_uses_article_then_body_and_titles_from_the_first_h1():
    page = b"<body><p>Outside</p><article><h1>Inside</h1><p>Kept</p></article></body>"
    document = load_bytes(page, source="a.htm")
    assert [b.text for b in document.blocks] == ["Inside", "Kept"]
    assert document.title == "Inside"
    document = load_bytes(b"<div>Loose <em>text</em><p>para</p>tail</div>", source="b.html")
    assert [b.text for b in document.blocks] == ["Loose text", "para", "tail"]
    assert document.title is None


def test_html_honours_a_declared_charset():
    page = '<meta charset="latin-1"><p>Café crème</p>'.encode("latin-1")
    assert load_bytes(page, source="c.html").text == "Café crème"


# --- Plain text and decoding ----------------------------------------------------------------


def test_plain_text_is_split_into_paragraphs_on_blank_lines():
    data = "\ufeffFirst paragraph\nstill first.\r\n\r\n  \r\nSecond.\n\n\n\nThird.  \n".encode()
    document = load_bytes(data, source="notes.txt")
    assert [(b.kind, b.text, b.page, b.headings) for b in document.blocks] == [
        ("paragraph", "First paragraph\nstill first.", None, ()),
        ("paragraph", "Second.", None, ()),
        ("paragraph", "Third.", None, ()),
    ]
    assert document.title is None and document.media_type == "text/plain"
    assert_blocks_index_the_text(document)


def test_a_utf16_file_with_a_byte_order_mark_is_decoded():
    assert load_bytes("Grüße\n".encode("utf-16"), source="u.txt").text == "Grüße"


@pytest.mark.parametrize("name", ["latin1.txt", "latin1.md", "latin1.html"])
def test_text_that_is_not_utf8_is_an_error_not_a_guess(name: str):
    with pytest.raises(
        DocumentLoadError, match=rf"^{name}: is not valid utf-8 .*byte 0xe9 .*iconv"
    ):
        load_bytes("café".encode("latin-1"), source=name)


# --- load(), sources and errors -------------------------------------------------------------


def test_load_names_the_document_by_its_path_and_hashes_its_bytes(tmp_path: Path):
    (tmp_path / "docs").mkdir()
    path = tmp_path / "docs" / "faq.markdown"
    data = b"# FAQ\n\nAsk us."
    path.write_bytes(data)
    document = load(path)
    assert document.source == path.as_posix()
    assert document.content_hash == hashlib.sha256(data).hexdigest()
    assert document.media_type == "text/markdown"
    assert load(str(path), source="docs/faq.markdown").source == "docs/faq.markdown"


def test_supported_suffixes_are_what_load_reads():
    assert {".pdf", ".md", ".markdown", ".html", ".htm", ".txt"} <= SUPPORTED_SUFFIXES
    assert all(s == s.lower() and s.startswith(".") for s in SUPPORTED_SUFFIXES)


def test_the_suffix_is_matched_case_insensitively(tmp_path: Path):
    path = tmp_path / "README.TXT"
    path.write_bytes(b"hello")
    assert load(path).text == "hello"


@pytest.mark.parametrize("name", ["report.docx", "Makefile"])
def test_an_unsupported_file_names_the_supported_ones(tmp_path: Path, name: str):
    path = tmp_path / name
    path.write_bytes(b"data")
    with pytest.raises(DocumentLoadError, match=r"unsupported suffix .*\.md, .*skip it") as e:
        load(path)
    assert e.value.source == path.as_posix()
    with pytest.raises(DocumentLoadError, match=rf"^{name}: unsupported suffix"):
        load_bytes(b"data", source=name)


def test_an_unknown_media_type_is_a_load_error():
    with pytest.raises(DocumentLoadError, match=r"x\.bin: unsupported media type 'image/png'"):
        load_bytes(b"data", source="x.bin", media_type="image/png")


def test_the_media_type_overrides_the_suffix():
    document = load_bytes(b"# Title", source="upload", media_type="text/markdown")
    assert document.blocks[0].kind == "heading"


def test_a_missing_file_or_a_folder_is_a_load_error(tmp_path: Path):
    with pytest.raises(DocumentLoadError, match=r"missing\.pdf: no such file; check the path"):
        load(tmp_path / "missing.pdf")
    (tmp_path / "folder.md").mkdir()
    with pytest.raises(DocumentLoadError, match=r"folder\.md: is a folder"):
        load(tmp_path / "folder.md")


def test_an_empty_text_file_has_no_blocks():
    document = load_bytes(b"\n \n", source="empty.txt")
    assert document.blocks == () and document.text == ""


# --- properties -----------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(markdown)
def test_every_markdown_block_indexes_the_document_text(source: str):
    document = load_bytes(source.encode(), source="gen.md")
    assert_blocks_index_the_text(document)
    tables = [b for b in document.blocks if b.kind == "table"]
    assert len(tables) == source.count("\n|---")  # every generated table is one whole block


@settings(max_examples=150, deadline=None)
@given(plain_text)
def test_every_text_block_indexes_the_document_text(source: str):
    document = load_bytes(source.encode(), source="gen.txt")
    assert_blocks_index_the_text(document)
    assert document.text.split() == source.split()  # nothing lost, nothing added


# --- navigation is not content (HTML) -------------------------------------------------------

DOCBOOK = """<html><head><title>6.23. pam_permit - the promiscuous module</title></head><body>
<div class="navheader"><table width="100%" summary="Navigation header">
<tr><th colspan="3" align="center">6.23. pam_permit - the promiscuous module</th></tr>
<tr><td align="left"><a accesskey="p" href="a.html">Prev</a> </td>
<th align="center">Chapter 6. A reference guide</th>
<td align="right"> <a accesskey="n" href="b.html">Next</a></td></tr></table><hr></div>
<div class="section"><div class="titlepage"><h2 class="title">6.23. pam_permit - the promiscuous
module</h2></div><div class="toc"><p><b>Table of Contents</b></p><dl><dt><a href="#d">6.23.1.
DESCRIPTION</a></dt></dl></div>
<div class="section"><h3 class="title">6.23.1. DESCRIPTION</h3>
<p>pam_permit is a PAM module that always permits access.</p></div></div>
<div class="navfooter"><hr><table width="100%" summary="Navigation footer">
<tr><td align="left"><a accesskey="p" href="a.html">Prev</a> </td>
<td align="center"><a accesskey="u" href="c.html">Up</a></td>
<td align="right"> <a accesskey="n" href="b.html">Next</a></td></tr>
<tr><td>6.22. pam_nologin - prevent logins</td><td><a accesskey="h" href="i.html">Home</a></td>
<td>6.24. pam_pwhistory - grant access</td></tr></table></div></body></html>"""

SPHINX = """<html><head><title>json — JSON encoder and decoder — Python 3.11 documentation</title>
</head><body>
<div class="mobile-nav"><nav class="nav-content" role="navigation"><a href="/">Python</a>
</nav></div>
<div class="related" role="navigation" aria-label="related navigation"><h3>Navigation</h3>
<ul><li><a href="genindex.html">index</a></li><li><a href="next.html">next</a> |</li>
<li><a href="prev.html">previous</a> |</li><li><a href="index.html">3.11 Documentation</a>
&#187;</li></ul></div>
<div class="document"><div class="documentwrapper"><div class="body" role="main">
<section id="module-json"><h1>json — JSON encoder and decoder<a class="headerlink"
href="#module-json" title="Permalink to this heading">¶</a></h1>
<p>JSON is a lightweight data interchange format.</p>
<section id="basic-usage"><h2>Basic Usage<a class="headerlink" href="#basic-usage">¶</a></h2>
<dl class="py function"><dt class="sig" id="json.dump">json.dump(obj, fp)<a class="headerlink"
href="#json.dump">¶</a></dt><dd><p>Serialize obj to fp.</p></dd></dl></section></section>
</div></div>
<div class="sphinxsidebar" role="navigation"><h3>Table of Contents</h3><ul><li><a href="#">json
</a></li></ul><h4>Previous topic</h4><p><a href="p.html">email.iterators</a></p>
<div role="note"><h3>This Page</h3><ul class="this-page-menu"><li><a href="b.html">Report a Bug
</a></li></ul></div></div></div>
<div class="footer">&copy; Copyright 2001-2026. Last updated on October 07, 2026.</div>
</body></html>"""

ASCIIDOC = """<html><head><title>git-commit(1)</title></head><body class="manpage">
<div id="header"><h1>git-commit(1) Manual Page</h1><h2>NAME</h2><div class="sectionbody">
<p>git-commit - Record changes to the repository</p></div></div>
<div id="content"><div id="toc"><div id="toctitle">Table of Contents</div></div>
<div class="sect1"><h2 id="_description">DESCRIPTION</h2><div class="sectionbody">
<div class="paragraph"><p>Create a new commit containing the contents of the index.</p></div>
</div></div></div>
<div id="footnotes"><hr /></div>
<div id="footer"><div id="footer-text">Last updated 2024-05-31 00:35:55 UTC</div></div>
</body></html>"""

GENERIC = """<html><head><title>Shipping</title></head><body>
<a class="skip-link" href="#main">Skip to main content</a>
<div role="banner"><p>ACME Store</p></div>
<ol class="breadcrumb"><li><a href="/">Docs</a></li><li><a href="/ship">Delivery</a></li></ol>
<p><a href="a.html">Prev</a> | <a href="u.html">Up</a> | <a href="/">Home</a> |
<a href="b.html">Next</a></p>
<table><tr><td><a rel="prev" href="a.html">&lt;&lt; Returns</a></td>
<td><a rel="next" href="b.html">Warranty &gt;&gt;</a></td></tr></table>
<h1>Shipping</h1><p>Parcels leave within two days.</p>
<table><tr><th>Zone</th><th>Price</th></tr><tr><td><a href="eu.html">EU</a></td><td>5</td></tr>
</table>
<div role="contentinfo"><p>Contact us</p></div></body></html>"""

TEXINFO = """<html><head><title>Introduction (GNU Sed)</title></head><body lang="en">
<div class="chapter-level-extent" id="Introduction">
<div class="nav-panel"><p>Next: <a href="Invoking-sed.html" accesskey="n" rel="next">Running
sed</a>, Previous: <a href="index.html" accesskey="p" rel="prev">GNU sed</a>, Up: <a
href="index.html" accesskey="u" rel="up">GNU sed</a> &nbsp; [<a href="index.html#SEC_Contents"
title="Table of contents" rel="contents">Contents</a>]</p></div><hr>
<h2 class="chapter" id="Introduction-1">1 Introduction</h2>
<p><code>sed</code> is a stream editor.</p><hr>
<div class="header"><p>Next: <a href="Invoking-sed.html" accesskey="n" rel="next">Running
sed</a>, Previous: <a href="index.html" accesskey="p" rel="prev">GNU sed</a> &nbsp;
[<a href="Concept-Index.html" title="Index" rel="index">Index</a>]</p></div></div>
</body></html>"""

NAVIGATION_WORDS = ("Prev", "Next", "Up", "Home", "previous", "Navigation", "Table of Contents")


@pytest.mark.parametrize(
    ("page", "title", "first", "kept"),
    [
        (
            DOCBOOK,
            "6.23. pam_permit - the promiscuous module",
            ("6.23. pam_permit - the promiscuous module",),
            ["6.23.1. DESCRIPTION", "pam_permit is a PAM module that always permits access."],
        ),
        (
            SPHINX,
            "json — JSON encoder and decoder",
            ("json — JSON encoder and decoder",),
            ["Basic Usage", "json.dump(obj, fp)", "Serialize obj to fp."],
        ),
        (
            ASCIIDOC,
            "git-commit(1)",
            ("git-commit(1) Manual Page",),
            ["NAME", "Create a new commit containing the contents of the index."],
        ),
        (TEXINFO, "Introduction (GNU Sed)", ("1 Introduction",), ["sed is a stream editor."]),
        (
            GENERIC,
            "Shipping",
            ("Shipping",),
            ["Parcels leave within two days.", "Zone | Price\nEU | 5"],
        ),
    ],
    ids=["docbook", "sphinx", "asciidoc", "texinfo", "generic"],
)
def test_html_drops_the_navigation_of_documentation_generators(
    page: str, title: str, first: tuple[str, ...], kept: list[str]
):
    document = load_bytes(page.encode(), source="page.html")
    texts = [b.text for b in document.blocks]
    assert all(text in texts for text in kept), texts
    for word in (*NAVIGATION_WORDS, "¶", "Last updated", "Skip to", "Report a Bug", "ACME"):
        assert re.search(rf"(?<!\w){re.escape(word)}(?!\w)", document.text) is None, word
    assert document.blocks[0].kind == "heading"  # the page starts with its heading
    assert document.title == title
    chunks = chunk(document)
    assert chunks[0].headings == first
    assert {c.metadata["title"] for c in chunks} == {title}
    assert_blocks_index_the_text(document)


nav_furniture = st.sampled_from(
    [
        '<div class="navheader"><table><tr><td><a accesskey="p" href="p.html">Prev</a></td>'
        '<td><a accesskey="n" href="n.html">Next</a></td></tr></table></div>',
        '<div class="navfooter"><table><tr><td><a href="p.html">Prev</a></td><td><a href="u.'
        'html">Up</a></td><td><a href="n.html">Next</a></td></tr><tr><td>Prior page</td><td>'
        '<a href="i.html">Home</a></td><td>Later page</td></tr></table></div>',
        '<div class="related" role="navigation"><h3>Navigation</h3><ul><li><a href="g.html">'
        'index</a></li><li><a href="n.html">next</a> |</li></ul></div>',
        '<div class="sphinxsidebar"><h3>Table of Contents</h3><p>Quick search</p></div>',
        '<div class="footer">Copyright holder. Created using Sphinx.</div>',
        '<div id="footer"><div id="footer-text">Last updated 2024-05-31</div></div>',
        '<nav aria-label="breadcrumb"><a href="/">Docs</a> / <a href="/x">Guide</a></nav>',
        '<ul class="breadcrumbs"><li><a href="/">Docs</a></li><li>Guide</li></ul>',
        '<a class="skip-link" href="#content">Skip to content</a>',
        '<p><a href="p.html">Prev</a> | <a href="u.html">Up</a> | <a href="h.html">Home</a> | '
        '<a href="n.html">Next</a></p>',
        '<div id="toc"><div id="toctitle">Table of Contents</div></div>',
        '<div class="navpath"><ul><li><a href="index.html">Main Page</a></li></ul></div>',
        '<div class="header"><p>Next: <a rel="next" accesskey="n" href="n.html">Later</a>, '
        'Up: <a rel="up" href="u.html">Guide</a> [<a rel="contents" href="c.html">Contents</a>]'
        "</p></div>",
    ]
)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(nav_furniture, max_size=3),
    st.lists(sentence, min_size=1, max_size=4),
    st.lists(nav_furniture, max_size=3),
    st.sampled_from(["", "<main>", '<div role="main">']),
)
def test_navigation_around_any_page_is_dropped_and_the_content_kept(
    before: list[str], sentences: list[str], after: list[str], wrapper: str
):
    closing = {"": "", "<main>": "</main>", '<div role="main">': "</div>"}[wrapper]
    body = "".join(f"<p>{s}</p>" for s in sentences)
    heading = '<h1>Refund policy<a class="headerlink" href="#r">¶</a></h1>'
    page = f"<html><body>{''.join(before)}{wrapper}{heading}{body}{closing}{''.join(after)}"
    document = load_bytes(f"{page}</body></html>".encode(), source="gen.html")
    assert [b.text for b in document.blocks] == ["Refund policy", *sentences]
    assert chunk(document)[0].headings == ("Refund policy",)


def test_html_text_keeps_a_word_that_merely_looks_like_navigation():
    page = b"<h1>Moving</h1><p>Next, press Up.</p><table><tr><td>Home</td><td>3</td></tr></table>"
    document = load_bytes(page, source="m.html")
    assert [b.text for b in document.blocks] == ["Moving", "Next, press Up.", "Home | 3"]


# --- links are their text (Markdown) --------------------------------------------------------


def test_markdown_links_keep_their_text_and_code_keeps_its_source():
    source = """\
# Guide [home](index.html)

See [the refunds page](refunds.html "Refunds") and ![a chart](chart.png "Chart"), or
[![logo](logo.png)](https://example.com). Also [Returns], [the form][form], [Returns][]
and [undefined][nope]; write to <mailto:help@example.com> or <https://example.com/a?b=1>.
`[code](x.html)` stays, and so does \\[escaped](x.html).

| Zone | Page |
|---|---|
| EU | [prices](eu.html) |

```
[fenced](code.html)
```

[Returns]: returns.html "Returns"
[form]: <form.html>
"""
    document = load_bytes(source.encode(), source="guide.md")
    assert [b.text for b in document.blocks] == [
        "# Guide home",
        "See the refunds page and a chart, or\nlogo. Also Returns, the form, Returns\n"
        "and [undefined][nope]; write to mailto:help@example.com or https://example.com/a?b=1.\n"
        "`[code](x.html)` stays, and so does \\[escaped](x.html).",
        "| Zone | Page |\n|---|---|\n| EU | prices |",
        "```\n[fenced](code.html)\n```",
    ]
    assert document.blocks[1].headings == ("Guide home",)
    assert_blocks_index_the_text(document)


link = st.tuples(
    st.sampled_from(["", "!"]),
    st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=3).map(" ".join),
    st.sampled_from(["page.html", "../a/b.html#x", "<with space.html>", "https://e.org/x_(y)"]),
    st.sampled_from(["", ' "A title"', " 'single'", " (parens)"]),
).map(lambda p: (p[1], f"{p[0]}[{p[1]}]({p[2]}{p[3]})"))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(sentence.map(lambda s: (s, s)), link), min_size=1, max_size=12))
def test_any_inline_link_or_image_reads_as_its_text(parts: list[tuple[str, str]]):
    source = " ".join(markup for _, markup in parts)
    document = load_bytes(source.encode(), source="gen.md")
    assert document.text == " ".join(text for text, _ in parts)


# --- running headers and footers (PDF) ------------------------------------------------------


def printed_web_page(paragraphs: list[list[str]], *, font: str | None = None) -> bytes:
    """A PDF as a browser prints a web page: date and title on top, address and 1/N below."""

    class Printed(FPDF):
        def header(self) -> None:
            self.set_font(self.font_name, size=8)
            self.cell(60, 5, "11/28/26, 9:21 AM")
            self.cell(0, 5, "Refund policy - ACME", align="C")
            self.ln(12)

        def footer(self) -> None:
            self.set_y(-12)
            self.set_font(self.font_name, size=8)
            self.cell(150, 5, "\ufb01le:///home/ana/refunds.html" if font else "file:///r.html")
            self.cell(0, 5, f"{self.page_no()}/{{nb}}", align="R")

    pdf = Printed()
    pdf.font_name = "Helvetica"
    if font is not None:
        pdf.add_font("DejaVu", fname=font)
        pdf.font_name = "DejaVu"
    for page in paragraphs:
        pdf.add_page()
        pdf.set_font(pdf.font_name, size=12)
        for text in page:
            pdf.multi_cell(0, 6, text)
            pdf.ln(6)
    return bytes(pdf.output())


PRINTED = [
    ["Refunds are paid within 14 days.", "Store credit never expires."],
    ["Damaged items are refunded in full.", "Keep the receipt."],
    ["Sale items are final.", "Call us on weekdays."],
]


def test_a_printed_web_pages_headers_footers_and_page_counters_are_dropped():
    document = load_bytes(printed_web_page(PRINTED), source="printed.pdf")
    assert [(b.page, b.text) for b in document.blocks] == [
        (number, text) for number, page in enumerate(PRINTED, 1) for text in page
    ]


def test_pages_that_are_all_one_repeated_line_keep_it():
    document = load_bytes(make_pdf([[(12, "Thank you.")]] * 3), source="thanks.pdf")
    assert [b.text for b in document.blocks] == ["Thank you."] * 3


def test_a_line_on_one_page_only_or_numbers_inside_text_are_kept():
    pages = [["Chapter 1 opens here."], ["Rates rose 3/4 of a point."], ["Closing words."]]
    document = load_bytes(printed_web_page(pages), source="p.pdf")
    assert [b.text for b in document.blocks] == [text for page in pages for text in page]


DEJAVU = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")


@pytest.mark.skipif(not DEJAVU.exists(), reason="needs the DejaVu font (fonts-dejavu-core)")
def test_pdf_ligatures_are_spelled_out_and_offsets_stay_exact():
    pages = [["The \ufb01rst \ufb02oor o\ufb00ers e\ufb03cient ba\ufb04es."], ["Second page."]]
    document = load_bytes(printed_web_page(pages, font=str(DEJAVU)), source="l.pdf")
    assert [b.text for b in document.blocks] == [
        "The first floor offers efficient baffles.",
        "Second page.",
    ]
    for c in chunk(document):
        assert document.text[c.start : c.end] == c.text
    assert "\ufb01" not in document.text and "file:///" not in document.text


@pytest.mark.parametrize("name", ["n.txt", "n.md", "n.html"])
def test_compatibility_characters_are_made_plain_in_every_format(name: str):
    data = "O\ufb03ce\u00a0hours: \uff21\uff22\uff23\u200b 9\u2009am, 5 m² ½".encode()
    document = load_bytes(data, source=name)
    assert document.text == "Office hours: ABC 9 am, 5 m² ½"
    assert_blocks_index_the_text(document)


def test_a_running_header_numbered_in_roman_then_arabic_is_dropped_on_every_page():
    numbers = ["i", "ii", "1", "2", "3"]

    class Book(FPDF):
        def header(self) -> None:
            self.set_font("Helvetica", size=9)
            self.cell(0, 5, f"Handbook {numbers[self.page_no() - 1]}", align="R")
            self.ln(12)

    pdf = Book()
    for number in numbers:
        pdf.add_page()
        pdf.set_font("Helvetica", size=12)
        pdf.multi_cell(0, 6, f"Content of the page numbered {number}.")
    document = load_bytes(bytes(pdf.output()), source="book.pdf")
    assert [b.text for b in document.blocks] == [
        f"Content of the page numbered {number}." for number in numbers
    ]


# Sentences that print on one line each: a wrapped sentence's last words make a line of their
# own, which may stand at the same edge of two pages of two as another sentence does, and
# nothing in the text tells that from a running footer (the example below is the other case).
ONE_LINE = st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=3).map(
    lambda words: " ".join(words).capitalize() + "."
)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(ONE_LINE, min_size=2, max_size=12, unique=True),
    st.integers(1, 3),
    st.booleans(),
    st.booleans(),
)
# Found by CI: a page of one line ("Refund.") and a sentence whose last word wrapped onto a
# line of its own at the bottom of the next ("refund."): no running footer, but both were
# dropped as one (a line anywhere near either edge counted, and a one-line page counted too).
@example(["Refund.", " ".join(["Refund", *["refund"] * 13]) + " refund."], 1, False, False)
def test_any_printed_pages_lose_their_header_and_footer_and_keep_their_text(
    sentences: list[str], per_page: int, header: bool, footer: bool
):
    # a sentence repeated at the top of most pages would be a running header: none is;
    # and a header shows it runs on two pages at least (on one page it is content)
    per_page = min(per_page, len(sentences) - 1)
    pages = [sentences[i : i + per_page] for i in range(0, len(sentences), per_page)]

    class Printed(FPDF):
        def header(self) -> None:
            if header:
                self.set_font("Helvetica", size=8)
                self.cell(0, 5, f"Refund handbook - chapter two    {self.page_no()}")
                self.ln(12)

        def footer(self) -> None:
            if footer:
                self.set_y(-12)
                self.set_font("Helvetica", size=8)
                self.cell(0, 5, f"Page {self.page_no()} of {{nb}}", align="C")

    pdf = Printed()
    for page in pages:
        pdf.add_page()
        pdf.set_font("Helvetica", size=12)
        for text in page:
            pdf.multi_cell(0, 6, text)
            pdf.ln(6)
    document = load_bytes(bytes(pdf.output()), source="gen.pdf")
    assert [(b.page, b.text) for b in document.blocks] == [
        (number, text) for number, page in enumerate(pages, 1) for text in page
    ]
    assert_blocks_index_the_text(document)
