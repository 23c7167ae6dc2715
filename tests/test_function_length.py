"""No function of the package is longer than :data:`MAX_CODE_LINES` code lines (lines
that hold code: not blank, not only a comment, not part of a docstring), nested
functions counted in the function that holds them.  A long function is split into
helpers named for what they compute (the training kernel's step: inlined helpers,
``core/kernels/training.py``)."""
import ast
import io
import textwrap
import tokenize
from pathlib import Path

import mlem_neuro

ROOT = Path(mlem_neuro.__file__).parent
MAX_CODE_LINES = 150

_NOT_CODE = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
             tokenize.DEDENT, tokenize.ENDMARKER)


def _docstring_lines(tree):
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (body and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def function_lengths(source):
    """``{qualified name: code lines}`` of the functions in ``source``."""
    code = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _NOT_CODE:
            code.update(range(tok.start[0], tok.end[0] + 1))
    tree = ast.parse(source)
    code -= _docstring_lines(tree)
    out = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    out[name] = len(code & set(range(child.lineno, child.end_lineno + 1)))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def test_the_counter_counts_code_lines_only():
    source = textwrap.dedent('''
        def f(x):
            """A docstring
            over two lines."""
            # a comment

            y = (x +
                 1)
            def g():
                return y
            return g


        class C:
            def h(self):
                return 1
    ''')
    assert function_lengths(source) == {"f": 6, "f.g": 2, "C.h": 2}


def test_no_function_is_longer_than_the_limit():
    long = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for name, n in function_lengths(path.read_text()).items():
            if n > MAX_CODE_LINES:
                long.append(f"{rel}:{name} ({n} code lines)")
    assert not long, (f"functions over {MAX_CODE_LINES} code lines (split them into "
                      "helpers): " + "; ".join(long))
