"""Functions and doc comments of JavaScript, TypeScript, Go, Rust and Java (mlxio.data.polyglot),
and mining them into pairs beside Python's."""

from __future__ import annotations

import pytest

from mlxio.data import pairs, polyglot

pytest.importorskip("tree_sitter_language_pack")

SOURCES = {
    "javascript": ("lib.js", '''/**
 * Parse a date string into its parts.
 * @param {string} text the date
 * @returns {number[]}
 */
export function parseDate(text) {
  const [d, m, y] = text.split("/");
  return [Number(y), Number(m), Number(d)];
}

class Queue {
  /** Push an item onto the {@code queue} tail. */
  push(item) {
    this.items.push(item);
    this.size += 1;
  }
  empty() { return true; }
}

// not a doc comment
const merge = (a, b) => {
  const out = a.concat(b);
  return out.sort();
};
'''),
    "typescript": ("lib.ts", '''/** Read all lines of a file. */
export const readLines = (path: string): string[] => {
  const text = fs.readFileSync(path, "utf8");
  return text.split("\\n");
};

export abstract class Shape {
  abstract area(): number;
  /** Scale the shape by a <b>factor</b>. */
  scale(factor: number): void {
    this.w *= factor;
    this.h *= factor;
  }
}
'''),
    "go": ("tree.go", '''package tree

// Insert adds a key to the tree
// and rebalances it.
func Insert(t *Tree, key int) *Tree {
	if t == nil {
		return &Tree{Key: key}
	}
	return t.insert(key)
}

// String renders the tree as text.
func (t *Tree) String() string {
	var b strings.Builder
	t.walk(&b)
	return b.String()
}

func (t *Tree) Empty() bool { return false }
'''),
    "rust": ("lib.rs", '''/// Count the words of a line of text.
/// Words are split on whitespace.
#[inline]
pub fn count_words(line: &str) -> usize {
    let words = line.split_whitespace();
    words.count()
}

impl<T: Clone> Stack<T> {
    /** Pop the top item off the stack. */
    fn pop(&mut self) -> Option<i32> {
        let top = self.items.pop();
        top
    }
    fn todo(&self) -> i32 { todo!() }
}

trait Shape { fn area(&self) -> f64; }
'''),
    "java": ("Cache.java", '''package x;

public class Cache {
    /**
     * Evict the least recently used entry.
     * <p>Called when the cache is full.
     * @return the evicted key
     */
    @Override
    public String evict() {
        String key = order.removeFirst();
        map.remove(key);
        return key;
    }

    public Cache() {
        this.map = new HashMap<>();
    }
}
'''),
}

EXPECTED = {  # name: (line, end_line, doc, trivial)
    "javascript": {"parseDate": (6, 9, "Parse a date string into its parts.", False),
                   "Queue.push": (13, 16, "Push an item onto the queue tail.", False),
                   "Queue.empty": (17, 17, "", True),
                   "merge": (21, 24, "", False)},
    "typescript": {"readLines": (2, 5, "Read all lines of a file.", False),
                   "Shape.scale": (10, 13, "Scale the shape by a factor.", False)},
    "go": {"Insert": (5, 10, "adds a key to the tree\nand rebalances it.", False),
           "Tree.String": (13, 17, "renders the tree as text.", False),
           "Tree.Empty": (19, 19, "", True)},
    "rust": {"count_words": (4, 7, "Count the words of a line of text.\nWords are split on whitespace.", False),
             "Stack.pop": (11, 14, "Pop the top item off the stack.", False),
             "Stack.todo": (15, 15, "", True)},
    "java": {"Cache.evict": (9, 14, "Evict the least recently used entry.\nCalled when the cache is full.", False),
             "Cache.Cache": (16, 18, "", False)},
}


@pytest.mark.parametrize("language", sorted(SOURCES))
def test_functions_docs_lines_and_stubs(language):
    name, text = SOURCES[language]
    grammar = polyglot.language_of(name)
    found = {f.name: f for f in polyglot.functions(text, grammar)}
    assert set(found) == set(EXPECTED[language])  # signatures without a body are no functions
    lines = text.split("\n")
    for fn, (line, end_line, doc, trivial) in EXPECTED[language].items():
        f = found[fn]
        assert (f.line, f.end_line, f.doc, f.trivial) == (line, end_line, doc, trivial), fn
        assert f.code.splitlines()[-1].strip() == lines[end_line - 1].strip()
        assert "/**" not in f.code and "///" not in f.code  # the doc comment is not in the code


def test_mining_other_languages_gives_pairs_with_licence_free_sources(tmp_path):
    root = tmp_path / "src"
    for language, (name, text) in SOURCES.items():
        (root / language).mkdir(parents=True)
        (root / language / name).write_text(text)
    (root / "go" / "tree_test.go").write_text(SOURCES["go"][1].replace("func ", "func Test"))
    (root / "node_modules" / "dep").mkdir(parents=True)
    (root / "node_modules" / "dep" / "index.js").write_text(SOURCES["javascript"][1])
    corpus = pairs.mine_corpus([root], suffixes=polyglot.SUFFIXES)
    got = {(p.name, p.query) for p in corpus.pairs}
    assert ("parseDate", "Parse a date string into its parts.") in got
    assert ("Insert", "adds a key to the tree and rebalances it.") in got
    assert ("Cache.evict", "Evict the least recently used entry.") in got
    assert ("count_words", "Count the words of a line of text.") in got
    assert not any("node_modules" in p.source or p.source.endswith("_test.go") for p in corpus.pairs)
    assert all(p.end_line >= p.line > 0 for p in corpus.pairs)
    # the test file's functions are kept as extras, never pairs; Python-only mining sees none of it
    assert any(s.source.endswith("tree_test.go") for s in corpus.extras)
    assert pairs.mine_corpus([root]).report.files == 0


def test_test_file_conventions():
    for name in ("test_x.py", "x_test.go", "a.test.js", "a.spec.ts", "FooTest.java", "TestFoo.java"):
        assert polyglot.is_test_file(name), name
    for name in ("x.py", "testing.go", "spec.js", "Tester.java", "contest.rs"):
        assert not polyglot.is_test_file(name), name
