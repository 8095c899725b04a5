"""Running tests and reporting them (inside the sandbox; standard library only).

Used in two places: by the single-interpreter mode (``verdict="shared"``: program and tests in one
interpreter) and by the judge of the split mode, where the namespace holds references to the
program's objects in the candidate process instead of the objects.
Records are nonce-tagged JSON lines on the result descriptor, which only trusted processes hold.
"""

from __future__ import annotations

import _json
import os
import signal
import sys
import types

PROGRAM_MODULE = "__sandbox_program__"
TESTS_MODULE = "__sandbox_tests__"  # the judge's module for the test source (split mode)
MESSAGE_CHARS = 2000
Emit = "Callable[..., None]"  # annotation only (typing is not imported, to start fast)


class TestTimeout(BaseException):
    """Raised by the per-test alarm (or when the program ran out of CPU time); a BaseException so
    ``except Exception`` does not eat it. Its text, if any, replaces the default message."""


def _make_encoder():  # noqa: ANN202
    encode_str = _json.encode_basestring_ascii

    def to_json(value: object) -> str:
        """Minimal JSON encoder (str, int, float, bool, None, list, dict); no json import."""
        if isinstance(value, str):
            return encode_str(value)
        if value is None or isinstance(value, bool):
            return {None: "null", True: "true", False: "false"}[value]
        if isinstance(value, (int, float)):
            return repr(value) if value == value and abs(value) != float("inf") else "null"
        if isinstance(value, (list, tuple)):
            return "[" + ",".join(to_json(v) for v in value) + "]"
        if isinstance(value, dict):
            return "{" + ",".join(f"{to_json(str(k))}:{to_json(v)}" for k, v in value.items()) + "}"
        return to_json(str(value))

    return to_json


# The program runs in this interpreter and can rebind module globals and builtins, so the
# reporting path keeps its own references (closures, default arguments), taken at import.
to_json = _make_encoder()


def make_emitter(fd: int, nonce: str, _write=os.write, _encode=to_json):  # noqa: ANN001, ANN201
    """A function writing nonce-tagged JSON records, one per line, to the result fd."""

    def emit(kind: str, **fields: object) -> None:
        record = dict(fields, type=kind, nonce=nonce)
        data = (_encode(record) + "\n").encode()
        try:
            while data:
                data = data[_write(fd, data) :]
        except OSError:
            pass  # the program closed our descriptor: its tests simply go unreported

    return emit


def clip(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + "..."


def text_of(exc: BaseException) -> str:
    """str(exc), which runs program code and so may itself raise."""
    try:
        return str(exc)
    except BaseException:  # noqa: BLE001
        return "<unprintable exception>"


def describe(exc: BaseException) -> str:
    text = text_of(exc)
    return clip(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


# --------------------------------------------------------------------------- isolation


# --------------------------------------------------------------------------- running tests


def _alarm(_signum: int, _frame: object) -> None:
    raise TestTimeout()


def _start_timer(seconds: float, _setitimer=signal.setitimer) -> None:  # noqa: ANN001
    _setitimer(signal.ITIMER_REAL, max(seconds, 0.001))


def _stop_timer(_setitimer=signal.setitimer) -> None:  # noqa: ANN001
    _setitimer(signal.ITIMER_REAL, 0)


def _failure_message(exc: BaseException, source: str) -> str:
    """The assertion message, or else the failing line of the test source."""
    text = text_of(exc)
    if text:
        return clip(text)
    # Walk the traceback by hand: importing `traceback` now would run import machinery
    # the program may have tampered with.
    lineno, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith("<test"):
            lineno = tb.tb_lineno
        tb = tb.tb_next
    lines = source.splitlines()
    if lineno is not None and 0 < lineno <= len(lines):
        return clip(f"line {lineno}: {lines[lineno - 1].strip()}")
    return clip(source.strip())


def run_statement_test(
    index: int,
    source: str,
    namespace: dict,
    timeout: float,
    _compile=compile,
    _exec=exec,
    _start=_start_timer,  # noqa: ANN001
    _stop=_stop_timer,
) -> tuple[str, str]:  # noqa: ANN001
    """Run one assert statement / test block; returns (status, message)."""
    try:
        code = _compile(source, f"<test {index}>", "exec")
    except (SyntaxError, ValueError) as exc:
        return "error", describe(exc)
    try:
        _start(timeout)
        try:
            _exec(code, namespace)
        finally:
            _stop()
    except TestTimeout as exc:
        return "timeout", text_of(exc) or f"test exceeded {timeout:g} s"
    except AssertionError as exc:
        return "failed", _failure_message(exc, source)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt are test errors too
        return "error", describe(exc)
    return "passed", ""


def run_asserts(tests: list[str] | str, namespace: dict, timeout: float, emit: Emit, _run=run_statement_test) -> None:  # noqa: ANN001
    """Run each assert statement (or the one test block) as its own test."""
    items = [("check", tests)] if isinstance(tests, str) else [(f"assert {i}", t) for i, t in enumerate(tests)]
    emit("plan", names=[name for name, _ in items])
    for index, (name, source) in enumerate(items):
        emit("start", index=index)
        status, message = _run(index, source, namespace, timeout)
        emit("test", index=index, name=name, status=status, message=message)


def _test_case_classes(namespace: dict, module: str) -> list[type]:
    import unittest

    return [
        v
        for v in list(namespace.values())
        if isinstance(v, type) and issubclass(v, unittest.TestCase) and v.__module__ == module
    ]


def _make_result_class():  # noqa: ANN202 - built lazily so plain asserts never import unittest
    import unittest

    class StreamingResult(unittest.TestResult):
        """Reports each test as it finishes and arms the per-test alarm around it."""

        def __init__(self, emit: Emit, index: dict, timeout: float) -> None:
            super().__init__()
            self.emit, self.index, self.timeout = emit, index, timeout
            self.outcome: tuple[str, str] = ("passed", "")
            self.fixture_error = ""
            self.reported: set[str] = set()

        def _name(self, test: unittest.TestCase) -> str:
            return f"{type(test).__name__}.{test._testMethodName}"

        def startTest(self, test):  # noqa: N802, ANN001, ANN201
            super().startTest(test)
            self.outcome = ("passed", "")
            self.emit("start", index=self.index.get(self._name(test), -1))
            _start_timer(self.timeout)

        def stopTest(self, test):  # noqa: N802, ANN001, ANN201
            _stop_timer()
            name = self._name(test)
            self.reported.add(name)
            status, message = self.outcome
            self.emit("test", index=self.index.get(name, -1), name=name, status=status, message=message)
            super().stopTest(test)

        def _set(self, status: str, message: str) -> None:
            if self.outcome[0] == "passed":  # keep the first problem of a test
                self.outcome = (status, clip(message))

        def addFailure(self, test, err):  # noqa: N802, ANN001, ANN201
            self._set("failed", text_of(err[1]) or "assertion failed")

        def addError(self, test, err):  # noqa: N802, ANN001, ANN201
            if not isinstance(test, unittest.TestCase):  # setUpClass / module fixture failed
                self.fixture_error = describe(err[1])
            elif issubclass(err[0], TestTimeout):
                self._set("timeout", text_of(err[1]) or f"test exceeded {self.timeout:g} s")
            else:
                self._set("error", describe(err[1]))

        def addSubTest(self, test, subtest, err):  # noqa: N802, ANN001, ANN201
            if err is not None:
                failed = issubclass(err[0], test.failureException)
                (self.addFailure if failed else self.addError)(test, err)

        def addSkip(self, test, reason):  # noqa: N802, ANN001, ANN201
            self.outcome = ("passed", clip(f"skipped: {reason}"))

        def addUnexpectedSuccess(self, test):  # noqa: N802, ANN001, ANN201
            self._set("failed", "unexpected success")

    return StreamingResult


def run_unittests(namespace: dict, timeout: float, emit: Emit, module: str = PROGRAM_MODULE) -> None:
    """Run every TestCase class defined in ``module`` (the test source's), one record per method."""
    import unittest

    loader = unittest.TestLoader()
    classes = _test_case_classes(namespace, module)
    names = [f"{c.__name__}.{m}" for c in classes for m in loader.getTestCaseNames(c)]
    emit("plan", names=names)
    index = {name: i for i, name in enumerate(names)}
    result = _make_result_class()(emit, index, timeout)
    for cls in classes:
        result.fixture_error = ""
        try:
            loader.loadTestsFromTestCase(cls).run(result)
        except TestTimeout as exc:  # the alarm fired inside unittest's own bookkeeping
            result.fixture_error = text_of(exc) or f"test exceeded {timeout:g} s"
        for method in loader.getTestCaseNames(cls):
            name = f"{cls.__name__}.{method}"
            if name not in result.reported:
                status = "timeout" if "exceeded" in result.fixture_error else "error"
                emit(
                    "test",
                    index=index[name],
                    name=name,
                    status=status,
                    message=result.fixture_error or "test did not run",
                )


def load_source(source: str, filename: str, namespace: dict) -> tuple[str, str] | None:
    """Compile and execute module-level code; returns (status, message) if that fails."""
    try:
        code = compile(source, filename, "exec")
    except (SyntaxError, ValueError) as exc:
        return "syntax_error", describe(exc)
    try:
        exec(code, namespace)
    except BaseException as exc:
        return "program_error", describe(exc)
    return None


def _testcase_guard():  # noqa: ANN202
    """Snapshot of unittest.TestCase's attributes, restored before tests run, so a program
    cannot simply neuter assertEqual and friends."""
    import unittest

    saved = dict(vars(unittest.TestCase))

    def restore() -> None:
        for name, value in saved.items():
            if vars(unittest.TestCase).get(name) is not value:
                setattr(unittest.TestCase, name, value)

    return restore


def load_all(cfg: dict, namespace: dict) -> tuple[str, str] | None:
    """Load program, setup code and (for unittest) the test module; (status, message) on failure."""
    failure = load_source(cfg["program"], "<program>", namespace)
    if failure is None and cfg["setup"]:
        failure = load_source(cfg["setup"], "<setup>", namespace)
        if failure is not None:
            failure = ("program_error", "setup: " + failure[1])
    if failure is None and cfg["kind"] == "unittest":
        failure = load_source(cfg["tests"], "<tests>", namespace)
        if failure is not None:
            failure = ("program_error", "tests failed to load: " + failure[1])
    return failure


def run_job(cfg: dict, emit: Emit) -> None:
    """Load the program, run its tests, report everything, then emit "done"."""
    unittest_kind = cfg["kind"] == "unittest"
    restore = _testcase_guard() if unittest_kind else None
    runner = run_unittests if unittest_kind else run_asserts  # taken before the program runs
    set_handler, alarm = signal.signal, _alarm
    module = types.ModuleType(PROGRAM_MODULE)
    sys.modules[PROGRAM_MODULE] = module  # so pickling and unittest fixtures find it
    namespace = module.__dict__
    namespace["__file__"] = os.path.join(cfg["workdir"], "program.py")  # never written
    failure = load_all(cfg, namespace)
    if failure is not None:
        emit("load", status=failure[0], message=failure[1])
        return
    set_handler(signal.SIGALRM, alarm)
    if restore is not None:
        restore()
        runner(namespace, cfg["per_test_timeout"], emit)
    else:
        runner(cfg["tests"], namespace, cfg["per_test_timeout"], emit)
    emit("done")
