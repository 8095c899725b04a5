"""Code cleaning on what small models really write (pure: no execution)."""

import ast

from comlrl.envs.coding.clean import (
    clean_code,
    compiles,
    fix_first_line_indent,
    helper_references,
    ignored_helper_calls,
    is_trivial_wrapper,
    split_chunks,
    strip_fences,
)


def _fn(source: str) -> ast.FunctionDef:
    return ast.parse(source).body[0]


def test_fences_and_prose_keep_only_the_definition():
    text = (
        "Sure! Here is the helper function you asked for:\n\n"
        '```python\ndef aux(numbers):\n    """Sorted copy."""\n    return sorted(numbers)\n```\n\n'
        "This function sorts the list. Example usage:\n\n```python\nprint(aux([3, 1, 2]))\n```\n"
    )
    cleaned = clean_code(text)
    assert cleaned.fenced
    assert list(cleaned.functions) == ["aux"]
    assert cleaned.code == 'def aux(numbers):\n    """Sorted copy."""\n    return sorted(numbers)'
    assert cleaned.dropped == 1  # the print(...) demo
    assert cleaned.functions["aux"].returns


def test_prose_without_fences_before_between_and_after():
    text = (
        "Here's my solution. It loops once.\n"
        "def f(x):\n    y = aux(x)\n    return y + 1\n"
        "This runs in O(n) time.\nFor example f(3) returns 7.\n"
    )
    cleaned = clean_code(text)
    assert cleaned.code == "def f(x):\n    y = aux(x)\n    return y + 1"
    assert cleaned.dropped == 3


def test_repeated_signature_keeps_the_real_definition():
    # The prompt's stub echoed back, then the implementation.
    text = 'def add(a, b):\n    """Add two numbers."""\n\ndef add(a, b):\n    return a + b\n'
    cleaned = clean_code(text)
    assert cleaned.code == "def add(a, b):\n    return a + b"
    assert cleaned.duplicates == 1
    # A bare repeated signature line (does not parse on its own) is dropped as well.
    cleaned = clean_code("def add(a, b):\ndef add(a, b):\n    return a + b\n")
    assert cleaned.code == "def add(a, b):\n    return a + b"


def test_real_definition_before_echoed_stub_wins():
    text = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    pass\n"
    assert clean_code(text).code == "def add(a, b):\n    return a + b"


def test_main_block_and_demo_calls_are_dropped_constants_kept():
    text = (
        "import math\nR = 3\nPATTERN = re.compile('a+')\n\n"
        "def area(r):\n    return math.pi * r * r\n\n"
        "result = area(R)\nprint(result)\n\n"
        "if __name__ == '__main__':\n    print(area(2))\n    assert area(1) > 3\n"
    )
    cleaned = clean_code(text)
    assert (
        cleaned.code == "import math\n\nR = 3\n\nPATTERN = re.compile('a+')\n\ndef area(r):\n    return math.pi * r * r"
    )
    assert cleaned.dropped == 3  # result = area(R), print(result), the __main__ block


def test_body_with_unindented_first_line_is_wrapped_in_the_signature():
    text = "total = 0\n    for x in xs:\n        total += x\n    return total"
    cleaned = clean_code(text, signature="def total_of(xs):")
    assert cleaned.wrapped_body
    assert cleaned.code == "def total_of(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total"
    assert compiles(cleaned.code) is None
    # first line is a block header: its indentation is the shallower level
    assert (
        fix_first_line_indent("for x in xs:\n        y += x\n    return y")[0]
        == "    for x in xs:\n        y += x\n    return y"
    )


def test_body_is_not_wrapped_without_a_signature_or_when_garbage():
    assert clean_code("return x + 1").code == ""
    assert not clean_code("I cannot solve this.", signature="def f(x):").functions


def test_broken_definition_is_kept_so_it_fails_the_syntax_level():
    cleaned = clean_code("def f(x):\n    return (x +\n\nThanks for reading!")
    assert "f" in cleaned.functions and not cleaned.functions["f"].parsed
    assert cleaned.functions["f"].returns
    assert compiles(cleaned.code) is not None


def test_unclosed_fence_and_answer_starting_inside_a_fence():
    assert clean_code("Here you go:\n```python\ndef f(x):\n    return x").code == "def f(x):\n    return x"
    assert clean_code("def f(x):\n    return x\n```\nIt returns x.").code == "def f(x):\n    return x"


def test_non_python_fences_are_skipped():
    text = "```bash\npip install numpy\n```\n```python\ndef f():\n    return 1\n```"
    code, fenced = strip_fences(text)
    assert fenced and "pip" not in code and "def f" in code


def test_redefined_aux_is_removed_and_reported():
    main = clean_code("def aux(x):\n    return 0\n\ndef solve(x):\n    return aux(x) + 1\n")
    stripped = main.without({"aux"})
    assert list(stripped.functions) == ["solve"]
    assert stripped.removed == ["aux"]
    assert "def aux" not in stripped.code


def test_empty_and_none():
    assert clean_code("").code == "" and clean_code(None).functions == {}


def test_split_chunks_keeps_decorators_and_continuations():
    text = "@cache\ndef f(x):\n    return x\nif a:\n    b = 1\nelse:\n    b = 2\n"
    assert split_chunks(text) == ["@cache\ndef f(x):\n    return x", "if a:\n    b = 1\nelse:\n    b = 2"]


def test_stub_returns_nothing():
    cleaned = clean_code('def aux(x):\n    """helper"""\n')
    assert cleaned.functions["aux"].stub and not cleaned.functions["aux"].returns
    assert not clean_code("def aux(x):\n    return None\n").functions["aux"].returns
    assert clean_code("def aux(x):\n    yield x\n").functions["aux"].returns


def test_wrapper_ignored_and_references():
    helpers = {"aux"}
    assert is_trivial_wrapper(_fn("def f(a, b):\n    '''doc'''\n    return aux(a, b)"), helpers)
    assert is_trivial_wrapper(_fn("def f(a):\n    r = aux(a)\n    return r"), helpers)
    assert not is_trivial_wrapper(_fn("def f(a):\n    return aux(a) + 1"), helpers)
    assert not is_trivial_wrapper(_fn("def f(a):\n    return aux(sorted(a))"), helpers)
    assert ignored_helper_calls(_fn("def f(a):\n    aux(a)\n    return a"), helpers) == ["aux(a)"]
    assert ignored_helper_calls(_fn("def f(a):\n    return aux(a)"), helpers) == []
    assert helper_references(_fn("def f(xs):\n    return list(map(aux, xs))"), helpers) == {"aux"}
    assert helper_references(_fn("def f(xs):\n    return xs"), helpers) == set()


def test_compiles_catches_return_outside_function():
    assert compiles("def f():\n    return 1\n") is None
    assert "outside function" in compiles("return 1\n")


def test_docstring_continuation_at_column_zero():
    text = "Solution:\ndef f(x):\n    '''Doc\ncontinued at column 0\n    '''\n    return x\n"
    assert clean_code(text).code == "def f(x):\n    '''Doc\ncontinued at column 0\n    '''\n    return x"


def test_random_noise_never_raises():
    import random

    rng = random.Random(0)
    pieces = [
        "def ",
        "class ",
        "```python\n",
        "```",
        "\n",
        "    ",
        "\t",
        "(",
        ")",
        ":",
        "return ",
        '"""',
        "@",
        "aux(",
        "\\",
    ]
    for _ in range(300):
        text = "".join(rng.choice(pieces) if rng.random() < 0.5 else chr(rng.randint(32, 126)) for _ in range(120))
        cleaned = clean_code(text, signature="def f(x):")
        assert isinstance(cleaned.code, str)
