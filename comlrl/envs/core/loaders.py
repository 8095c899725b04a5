"""Reading task data: local JSON / JSONL / parquet files, Hugging Face ids, or in-memory rows.

Every environment's ``load_dataset(source, split, limit)`` goes through :func:`load_rows`:

* ``source`` that looks like ``org/name`` and is not an existing path: ``datasets.load_dataset(id)``;
  offline this fails with a :class:`DatasetError` that names the id and says to pass a local file.
* otherwise a local ``.json`` (a list of objects, or ``{"data": [...]}``), ``.jsonl`` or ``.parquet`` file;
* or a ``datasets.Dataset`` / list of dicts already in memory;
* ``source`` None: the environment's ``default`` rows (the data shipped in the package, see
  :mod:`.packaged`), never the network.

The source used is logged at INFO (``comlrl.envs.core.loaders``).

Rows are validated (a missing file, malformed JSON or a missing field raises :class:`DatasetError`
naming the file, the 1-based row number and the field) and normalised by the environment.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any, Callable, Iterable, Sequence

import datasets

from ...errors import ComlrlError

log = logging.getLogger(__name__)

_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_LOCAL_SUFFIXES = (".json", ".jsonl", ".parquet")


class DatasetError(ComlrlError):
    """Task data could not be read: names the file (or hub id), the row and the field."""


def looks_like_hub_id(source: str) -> bool:
    """True for ``"org/name"`` strings that are not an existing local path or a data file name."""
    return bool(_HF_ID.match(source)) and not os.path.exists(source) and not source.endswith(_LOCAL_SUFFIXES)


def read_json_records(path: str) -> list[dict]:
    """Rows of a local ``.json`` / ``.jsonl`` / ``.parquet`` file (each row a dict)."""
    if not os.path.exists(path):
        raise DatasetError(f"data file not found: '{path}'.")
    if path.endswith(".parquet"):
        return [dict(r) for r in datasets.Dataset.from_parquet(path)]
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    return parse_json_records(text, path)


def parse_json_records(text: str, path: str) -> list[dict]:
    """Rows of JSON text (a list of objects, or ``{"data": [...]}``) or, when ``path`` ends in ``.jsonl``,
    JSON Lines; ``path`` names the data in errors."""
    if path.endswith(".jsonl"):
        return _check_objects(_read_jsonl(text, path), path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg.startswith("Extra data"):  # JSON Lines under a .json name
            return _check_objects(_read_jsonl(text, path), path)
        raise DatasetError(f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}.") from exc
    if isinstance(data, dict):
        data = _unwrap(data, path)
    if not isinstance(data, list):
        raise DatasetError(
            f'{path}: expected a JSON list of objects (or {{"data": [...]}}), got {type(data).__name__}.'
        )
    return _check_objects(data, path)


def _read_jsonl(text: str, path: str) -> list:
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}: row {len(rows) + 1} (line {lineno}) is not valid JSON: {exc.msg}.") from exc
    return rows


def _unwrap(data: dict, path: str) -> list:
    for key in ("data", "rows", "examples", "train", "test"):
        if isinstance(data.get(key), list):
            return data[key]
    if data and all(isinstance(v, dict) for v in data.values()):  # {"task_id": {...}, ...}
        return [{"task_id": k, **v} if "task_id" not in v else v for k, v in data.items()]
    raise DatasetError(
        f"{path}: a JSON object must hold the rows under 'data' (a list); keys found: {sorted(data)[:8]}."
    )


def _check_objects(rows: list, path: str) -> list[dict]:
    for i, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise DatasetError(f"{path}: row {i} is a {type(row).__name__}, expected a JSON object.")
    return rows


def load_hub(hub_id: str, split: str, config: str | None = None) -> list[dict]:
    """Rows of a Hugging Face dataset; a clear error when it cannot be downloaded (e.g. offline)."""
    try:
        ds = (
            datasets.load_dataset(hub_id, config, split=split) if config else datasets.load_dataset(hub_id, split=split)
        )
    except Exception as exc:  # offline, unknown id, unknown split: all end the same way for the user
        raise DatasetError(
            f"could not load the Hugging Face dataset '{hub_id}' (split '{split}'): {type(exc).__name__}: {exc}. "
            f"Without network access, download it elsewhere and pass a local .json/.jsonl/.parquet path instead."
        ) from exc
    return [dict(r) for r in ds]


def require_fields(row: dict, fields: Iterable[str | tuple[str, ...]], where: str, index: int) -> None:
    """Raise :class:`DatasetError` naming ``where``, the 1-based row and the field when one is missing.

    A tuple in ``fields`` means "one of these" (e.g. ``("abstract", "abstract_text")``).
    """
    for field in fields:
        options = field if isinstance(field, tuple) else (field,)
        if not any(row.get(name) is not None for name in options):
            wanted = " or ".join(f"'{n}'" for n in options)
            raise DatasetError(f"{where}: row {index} is missing the field {wanted} (fields present: {sorted(row)}).")


def load_rows(
    source: str | Sequence[dict] | datasets.Dataset | None,
    *,
    split: str,
    limit: int | None,
    required: Sequence[str | tuple[str, ...]],
    normalize: Callable[[dict, int], dict],
    default: Callable[[str], list[dict]] | None = None,
    default_label: str | None = None,
    env_name: str = "",
    hub_config: str | None = None,
) -> datasets.Dataset:
    """Read, validate and normalise rows into a ``datasets.Dataset``.

    ``normalize(row, index)`` maps one raw row to the environment's schema; ``default(split)`` gives the
    offline default rows when ``source`` is None (``default_label`` names them in logs and errors).
    """
    if limit is not None and limit < 0:
        raise DatasetError(f"{env_name}: limit must be >= 0, got {limit}.")
    rows, where = _raw_rows(source, split=split, default=default, env_name=env_name, hub_config=hub_config)
    if source is None:
        where = default_label or where
    if limit is not None:
        rows = rows[:limit]
    out = []
    for i, row in enumerate(rows, start=1):
        require_fields(row, required, where, i)
        try:
            out.append(normalize(row, i))
        except DatasetError as exc:  # a row the normaliser refuses by name: the file and row number first
            raise DatasetError(f"{where}: row {i}: {exc}") from exc
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise DatasetError(f"{where}: row {i} could not be read: {type(exc).__name__}: {exc}.") from exc
    if not out:
        raise DatasetError(f"{where}: no rows (split '{split}', limit {limit}).")
    log.info("%s: %d rows from %s (split '%s')", env_name or "data", len(out), where, split)
    return datasets.Dataset.from_list(out)


def _raw_rows(
    source: Any, *, split: str, default: Any, env_name: str, hub_config: str | None
) -> tuple[list[dict], str]:
    if source is None:
        if default is None:
            raise DatasetError(
                f"{env_name}: no offline data ships with this environment; "
                "pass a local .json/.jsonl/.parquet path or a Hugging Face id."
            )
        return default(split), f"{env_name} default data"
    if isinstance(source, datasets.Dataset):
        return [dict(r) for r in source], f"{env_name} dataset"
    if isinstance(source, (list, tuple)):
        return [dict(r) for r in source], f"{env_name} rows"
    if not isinstance(source, (str, os.PathLike)):
        raise DatasetError(
            f"{env_name}: source must be a path, a Hugging Face id, a Dataset or a list of dicts; "
            f"got {type(source).__name__}."
        )
    source = os.fspath(source)
    if looks_like_hub_id(source):
        return load_hub(source, split, hub_config), f"Hugging Face dataset '{source}'"
    return read_json_records(source), source


def text_field(row: dict, *names: str) -> str:
    """The first of ``names`` present in ``row``, as a string (lists of sentences are joined)."""
    for name in names:
        value = row.get(name)
        if value is None:
            continue
        if isinstance(value, (list, tuple)):
            return " ".join(str(v).strip() for v in value)
        return str(value)
    raise KeyError(f"none of the fields {names} is present")
