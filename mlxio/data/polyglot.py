"""Functions and their doc comments in JavaScript, TypeScript, Go, Rust and Java, found by
tree-sitter (the grammars of `tree-sitter-language-pack`, loaded on first use).

    functions(text, "go")  # -> [Function(name="Tree.String", line=12, end_line=14, doc=..., code=...)]

A function's doc comment is the comment block right above it (no blank line between; Rust's
attributes and Java's annotations may sit between): `/** ... */` in JavaScript, TypeScript and
Java, consecutive `//` lines in Go, `///` lines or `/** */` in Rust. Its text is cleaned of
comment markers, JSDoc / Javadoc tags (`@param ...`, inline `{@code x}` -> `x`) and HTML tags;
Go's convention of opening with the function's own name is undone ("Add returns ..." ->
"returns ...") so that a query mined from it does not hand over the name. `code` is the
function's source (signature and body, dedented) without the doc comment, as Python's miner
(`mlxio.data.pairs`) keeps code without its docstring. Python itself is mined with `ast` there.
"""

from __future__ import annotations

import re
import textwrap
from functools import cache
from pathlib import PurePath

import attrs

# file suffix -> tree-sitter grammar name
LANGUAGES: dict[str, str] = {
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript",
    ".ts": "typescript", ".mts": "typescript", ".cts": "typescript", ".tsx": "tsx",
    ".go": "go", ".rs": "rust", ".java": "java",
}
# what a search's language filter calls each grammar (TypeScript's TSX is TypeScript)
LANGUAGE_NAMES: dict[str, str] = {"javascript": "javascript", "typescript": "typescript", "tsx": "typescript",
                                  "go": "go", "rust": "rust", "java": "java", "python": "python"}
SUFFIXES: tuple[str, ...] = (".py", *LANGUAGES)

_FUNCTIONS = {
    "javascript": {"function_declaration", "generator_function_declaration", "method_definition"},
    "go": {"function_declaration", "method_declaration"},
    "rust": {"function_item"},
    "java": {"method_declaration", "constructor_declaration"},
}
_FUNCTIONS["typescript"] = _FUNCTIONS["tsx"] = _FUNCTIONS["javascript"]
_FUNCTION_VALUES = {"arrow_function", "function_expression", "function", "generator_function"}
# nodes whose children are walked for functions, and whether they name a scope (class Foo -> Foo.)
_SCOPES = {"class_declaration", "abstract_class_declaration", "class", "interface_declaration",
           "enum_declaration", "record_declaration", "impl_item", "trait_item", "mod_item",
           "internal_module", "module"}
_PASS_THROUGH = {"program", "source_file", "export_statement", "class_body", "declaration_list",
                 "enum_body", "interface_body", "statement_block", "lexical_declaration",
                 "variable_declaration", "ambient_declaration"}
_LITERALS = {"number", "string", "true", "false", "null", "undefined", "nil", "integer_literal",
             "float_literal", "string_literal", "boolean_literal", "char_literal", "decimal_integer_literal",
             "interpreted_string_literal", "raw_string_literal", "int_literal", "unit_expression",
             "null_literal", "template_string", "iota"}
_STUB_MACROS = {"todo", "unimplemented", "unreachable"}
_COMMENTS = {"comment", "line_comment", "block_comment"}


@attrs.frozen(kw_only=True)
class Function:
    """One function: qualified `name` ("Class.method", Go's "Type.Method", Rust's "Type.method"),
    1-based `line` and `end_line` of its source, its cleaned doc comment ("" when none), its
    source `code`, how many lines its body's statements span (`body_lines`), and whether that
    body is `trivial` (empty, one literal return, a throw, todo!() ...)."""

    name: str
    line: int
    end_line: int
    doc: str
    code: str
    body_lines: int
    trivial: bool


def language_of(path: str | PurePath) -> str | None:
    """The grammar for a file by its suffix ("python" for .py), or None for other files."""
    suffix = PurePath(path).suffix.lower()
    return "python" if suffix == ".py" else LANGUAGES.get(suffix)


def is_test_file(name: str) -> bool:
    """Whether a file name is a test by its language's convention (`*_test.go`, `*.test.ts`,
    `*.spec.js`, `FooTest.java`, `test_*.py`): its functions give no training pairs."""
    stem = name.rsplit(".", 1)[0]
    return (name.startswith("test_") or stem.endswith(("_test", ".test", ".spec"))
            or (name.endswith(".java") and (stem.endswith(("Test", "Tests")) or re.match(r"Test[A-Z0-9_]", stem))))


@cache
def _parser(language: str):
    from tree_sitter_language_pack import get_parser

    return get_parser(language)


def functions(text: str, language: str) -> list[Function]:
    """Every function with a body in `text` (source of `language`, a LANGUAGES value), in
    source order, nested ones included."""
    source = text.encode()
    lines = text.split("\n")
    tree = _parser(language).parse(source)
    out: list[Function] = []
    _walk(tree.root_node, "", language, lines, out)
    return out


def _walk(node, prefix: str, language: str, lines: list[str], out: list[Function]) -> None:
    for child in node.named_children:
        kind = child.type
        if kind in _FUNCTIONS[language]:
            _add(child, child, prefix, language, lines, out)
            body = child.child_by_field_name("body")
            if body is not None:
                _walk(body, f"{prefix}{_name(child, language)}.", language, lines, out)
        elif kind == "variable_declarator":
            value = child.child_by_field_name("value")
            if value is not None and value.type in _FUNCTION_VALUES:
                _add(child, value, prefix, language, lines, out)
        elif kind in _SCOPES:
            name = child.child_by_field_name("name") or child.child_by_field_name("type")
            while name is not None and name.type in ("generic_type", "scoped_type_identifier"):
                name = name.child_by_field_name("type") or name.child_by_field_name("name")  # Foo<T> -> Foo
            scope = f"{prefix}{_text(name)}." if name is not None else prefix
            body = child.child_by_field_name("body")
            _walk(body if body is not None else child, scope, language, lines, out)
        elif kind in _PASS_THROUGH:
            _walk(child, prefix, language, lines, out)


def _text(node) -> str:
    return node.text.decode("utf-8", "replace")


def _name(node, language: str) -> str:
    name = node.child_by_field_name("name")
    text = _text(name) if name is not None else "<anonymous>"
    if language == "go" and node.type == "method_declaration":
        receiver = node.child_by_field_name("receiver")
        types = [n for n in _descendants(receiver) if n.type == "type_identifier"] if receiver is not None else []
        if types:
            text = f"{_text(types[0])}.{text}"
    return text


def _descendants(node):
    for child in node.named_children:
        yield child
        yield from _descendants(child)


def _add(decl, fn, prefix: str, language: str, lines: list[str], out: list[Function]) -> None:
    """Append the function declared by `decl` (`fn`: the node holding its body; the same node
    but for `const f = () => ...`, where the declaration is the statement)."""
    body = fn.child_by_field_name("body")
    if body is None:  # a signature only (interface, trait, abstract or overload declaration)
        return
    anchor = decl.parent if decl.type == "variable_declarator" else decl
    while anchor.parent is not None and anchor.parent.type in ("export_statement", "ambient_declaration"):
        anchor = anchor.parent
    first, last = anchor.start_point[0], anchor.end_point[0]
    head = lines[first][:anchor.start_point[1]] if first < len(lines) else ""
    segment = lines[first:last + 1]
    if segment:  # byte columns: the end cut first (on one line, the start cut then still holds)
        segment[-1] = segment[-1].encode()[:anchor.end_point[1]].decode("utf-8", "replace")
        if head.strip():  # something else precedes it on its first line: start at the node
            segment[0] = segment[0].encode()[anchor.start_point[1]:].decode("utf-8", "replace")
    statements = _statements(body)
    span = statements[-1].end_point[0] - statements[0].start_point[0] + 1 if statements else 0
    name = prefix + _name(decl, language)
    out.append(Function(name=name, line=first + 1, end_line=last + 1,
                        doc=_doc(anchor, language, name.rsplit(".", 1)[-1]),
                        code=textwrap.dedent("\n".join(segment)).strip("\n"),
                        body_lines=span, trivial=_trivial(body, statements)))


def _statements(body) -> list:
    """The statements of a body block (Go wraps them in a statement_list); an expression body
    (`x => x + 1`) is one statement."""
    if body.type not in ("statement_block", "block", "constructor_body"):
        return [body]
    items = [c for c in body.named_children if c.type not in _COMMENTS]
    if len(items) == 1 and items[0].type == "statement_list":
        items = [c for c in items[0].named_children if c.type not in _COMMENTS]
    return items


def _trivial(body, statements: list) -> bool:
    if not statements:
        return True
    if len(statements) > 1:
        return False
    only = statements[0]
    if only.type in ("throw_statement",):
        return True
    if only.type in ("expression_statement", "return_statement", "return_expression"):
        inner = [c for c in only.named_children if c.type not in _COMMENTS]
        if not inner:
            return True
        only = inner[0] if len(inner) == 1 else only
        if only.type == "expression_list" and len(only.named_children) == 1:
            only = only.named_children[0]
    if only.type in _LITERALS:
        return True
    if only.type == "macro_invocation":
        macro = only.child_by_field_name("macro")
        return macro is not None and _text(macro) in _STUB_MACROS
    return body.type not in ("statement_block", "block", "constructor_body") and only.type in _LITERALS


def _doc(anchor, language: str, name: str) -> str:
    """The cleaned doc comment right above `anchor` ("" when none)."""
    comments = []
    node, top = anchor.prev_named_sibling, anchor.start_point[0]
    while node is not None:
        if language == "rust" and node.type == "attribute_item":
            top = node.start_point[0]
            node = node.prev_named_sibling
            continue
        if node.type not in _COMMENTS or node.end_point[0] < top - 1:
            break
        comments.append(_text(node))
        top = node.start_point[0]
        node = node.prev_named_sibling
        if language in ("javascript", "typescript", "tsx", "java"):
            break  # one /** */ block
    comments.reverse()
    if language in ("javascript", "typescript", "tsx", "java"):
        if not comments or not comments[0].startswith("/**"):
            return ""
        return _clean_block(comments[0], tags=True)
    if language == "rust":
        if not comments or not all(c.startswith(("///", "/**")) and not c.startswith(("////", "/***"))
                                    for c in comments):
            return ""
        return "\n".join(_clean_block(c, tags=False) if c.startswith("/**") else c[3:].strip() for c in comments)
    # go: // lines (or a /* */ block)
    text = "\n".join(_clean_block(c, tags=False) if c.startswith("/*") else c[2:].strip() for c in comments)
    first, _, rest = text.partition(" ")
    if first == name and rest:
        text = rest
    return text.strip()


_INLINE_TAG = re.compile(r"\{@\w+\s+([^}]*)\}")
_HTML_TAG = re.compile(r"</?[A-Za-z][^>]*>")


def _clean_block(comment: str, tags: bool) -> str:
    """Text of a /** ... */ comment: markers and leading `*`s removed; with `tags`, everything
    from the first `@tag` line on dropped and inline tags and HTML unwrapped."""
    body = comment[3:-2] if comment.endswith("*/") else comment[3:]
    out = []
    for line in body.split("\n"):
        line = line.strip()
        line = line[1:].strip() if line.startswith("*") else line
        if tags and line.startswith("@"):
            break
        out.append(line)
    text = "\n".join(out).strip()
    if tags:
        text = _HTML_TAG.sub("", _INLINE_TAG.sub(r"\1", text))
    return text
