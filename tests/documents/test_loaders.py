from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from fpdf import FPDF
from hypothesis import given, settings

from handrail.documents._loaders import SUPPORTED_SUFFIXES, load, load_bytes
from handrail.exceptions import DocumentLoadError

from ._corpus import assert_blocks_index_the_text, markdown, plain_text

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
