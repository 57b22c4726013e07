"""``new-op`` and ``new-group``: stamp an op (or a whole group) from the templates in
``shared/release/templates/``, then rerun the generation (see ``generate.py``'s docstring).

A template is plain text with ``${placeholder}`` fields (:class:`string.Template`) and
line blocks kept only when a flag holds::

    [[cuda]]          kept with --cuda
    ...
    [[/cuda]]
    [[!cuda]]         kept without it
    ...
    [[/!cuda]]

Every change is planned in memory first (files to create, files to edit); nothing is written if
any check fails: an existing file is never overwritten, an existing op or group never redefined.
"""

from __future__ import annotations

import ast
import keyword
import re
import string
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ROOT / "packages"
TEMPLATES = Path(__file__).resolve().parent / "templates"
REGISTRY = PACKAGES / "kernels-jit" / "src" / "kernels_jit" / "registry.py"

FLOATS = ("float32", "float16", "bfloat16")
# What the stamped CUDA source dispatches on (the pointwise engine's packs take these).
CUDA_DTYPES = (*FLOATS, "int32")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
# Longest names the templates keep within the 100-column limit.
MAX_GROUP, MAX_NAME, MAX_DESCRIPTION = 16, 32, 80
LINE_LIMIT = 100
# Names the stamped files use beside the op's own (an op of one of these names would shadow it).
RESERVED = frozenset(
    {"assert_close", "cases", "csrc", "dtype", "lazy_ops", "make", "misaligned", "op", "ops"}
    | {"poison", "pytest", "randn", "re", "ref", "reference", "register_group", "torch"}
    | {"version"}
)
DEFAULT_DESCRIPTION = "out = x (TODO: what the op computes)"


class StampError(SystemExit):
    """A refusal: the message says why; nothing has been written."""

    def __init__(self, message: str) -> None:
        super().__init__(f"stamp: {message}")


# --- templates -----------------------------------------------------------------------------------

_BLOCK = re.compile(r"^\[\[(!?)(\w+)\]\]\n(.*?)^\[\[/\1\2\]\]\n", re.M | re.S)


def _blocks(text: str, flags: dict[str, bool]) -> str:
    def keep(match: re.Match) -> str:
        negate, flag, body = match.groups()
        return _blocks(body, flags) if flags[flag] != bool(negate) else ""

    return _BLOCK.sub(keep, text)


def render(template: str, flags: dict[str, bool] | None = None, **values: str) -> str:
    """The template ``templates/<template>`` with its blocks chosen and its fields filled."""
    text = _blocks((TEMPLATES / template).read_text(), flags or {})
    out = string.Template(text).substitute(values)
    if template.endswith(".py.tmpl"):
        long = [i + 1 for i, line in enumerate(out.splitlines()) if len(line) > LINE_LIMIT]
        if long:
            raise StampError(f"{template}: lines {long} exceed {LINE_LIMIT} columns")
    return out


def _title(prefix: str, text: str) -> str:
    """A docstring's opening line(s): ``\"\"\"<prefix><text>.``, wrapped at the line limit."""
    line = f'"""{prefix}{text.rstrip(".")}.'
    return textwrap.fill(line, width=LINE_LIMIT, break_on_hyphens=False)


# --- Python source edits (text in, text out; the result stays ruff-formatted) ---------------------


def _import_key(name: str) -> tuple[int, str]:
    """isort's order-by-type: CONSTANTS, then Classes, then functions and variables."""
    kind = 0 if name.isupper() and len(name) > 1 else 1 if name[:1].isupper() else 2
    return kind, name.lower()


def render_from(module: str, names: list[str]) -> str:
    """``from module import a, b`` on one line if it fits, else one name a line."""
    names = sorted(set(names), key=lambda n: _import_key(n.split(" as ")[0]))
    line = f"from {module} import {', '.join(names)}"
    if len(line) <= LINE_LIMIT:
        return line
    return f"from {module} import (\n" + "".join(f"    {n},\n" for n in names) + ")"


def import_block(imports: dict[str, list[str]]) -> str:
    """First-party ``from`` imports, sorted by module (as ruff's isort writes them)."""
    return "\n".join(render_from(m, imports[m]) for m in sorted(imports))


def _lines_replaced(text: str, first: int, last: int, new: str) -> str:
    """``text`` with its lines ``first..last`` (1-based, inclusive) replaced by ``new``."""
    lines = text.splitlines(keepends=True)
    return "".join([*lines[: first - 1], new if new.endswith("\n") else new + "\n", *lines[last:]])


def _insert_after_line(text: str, line: int, new: str) -> str:
    lines = text.splitlines(keepends=True)
    return "".join([*lines[:line], new, *lines[line:]])


def _bound_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def ensure_from_import(text: str, module: str, names: list[str]) -> str:
    """``text`` importing ``names`` from ``module``: merged into its ``from module import`` if
    there is one, else a new statement after the last import of a module sorting before it."""
    tree = ast.parse(text)
    missing = [n for n in names if n not in _bound_names(tree)]
    if not missing:
        return text
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    for node in imports:
        if isinstance(node, ast.ImportFrom) and node.module == module and node.level == 0:
            current = [a.name + (f" as {a.asname}" if a.asname else "") for a in node.names]
            tail = text.splitlines()[node.end_lineno - 1][node.end_col_offset :]
            new = render_from(module, current + missing) + tail
            return _lines_replaced(text, node.lineno, node.end_lineno, new)
    before = [
        n for n in imports if isinstance(n, ast.ImportFrom) and (n.module or "") < module
    ]  # fmt: skip
    anchor = before[-1] if before else imports[-1]
    return _insert_after_line(text, anchor.end_lineno, render_from(module, missing) + "\n")


def _call_named(tree: ast.Module, func: str) -> ast.Call | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == func:
            return node
    return None


def declared_ops(init_text: str) -> list[str]:
    """The op names a group's ``__init__`` declares (the ``op("<name>", ...)`` calls)."""
    names = []
    for node in ast.walk(ast.parse(init_text)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "op"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names.append(node.args[0].value)
    return names


def _after_last_item(text: str, items: list[ast.expr], what: str) -> tuple[int, str, str]:
    """(line of the last item's end, its indentation, text to append to that line: a comma if
    the item has none)."""
    if not items:
        raise StampError(f"{what} is empty; add the entry by hand")
    last = items[-1]
    line = text.splitlines()[last.end_lineno - 1]
    first_line = text.splitlines()[items[-1].lineno - 1]
    indent = first_line[: len(first_line) - len(first_line.lstrip())]
    comma = "" if line[last.end_col_offset :].lstrip().startswith(",") else ","
    return last.end_lineno, indent, comma


def _add_comma(text: str, line: int, col: int) -> str:
    lines = text.splitlines(keepends=True)
    lines[line - 1] = lines[line - 1][:col] + "," + lines[line - 1][col:]
    return "".join(lines)


def insert_op_decl(init_text: str, decl: str, path: Path) -> str:
    """``init_text`` with ``decl`` (``op(...)``) as the last argument of ``register_group(...)``."""
    call = _call_named(ast.parse(init_text), "register_group")
    if call is None:
        raise StampError(f"{path}: no `OPS = register_group(__name__, ...)` call")
    line, indent, comma = _after_last_item(init_text, call.args, f"{path}: register_group()")
    if comma:
        init_text = _add_comma(init_text, line, call.args[-1].end_col_offset)
    return _insert_after_line(init_text, line, textwrap.indent(decl, indent) + "\n")


def op_decl(name: str, description: str, backends: str, dtypes_expr: str) -> str:
    """The one-line ``op(...)`` declaration (one argument a line if it is too long)."""
    args = [f'"{name}"', f'"{description}"', *([f'"{backends}"'] if backends else [])]
    args.append(f"dtypes={dtypes_expr}")
    line = f"op({', '.join(args)}),"
    if len(line) + 4 <= LINE_LIMIT:
        return line
    return "op(\n" + "".join(f"    {a},\n" for a in args) + "),"


def insert_all_name(init_text: str, name: str, path: Path) -> str:
    """``init_text`` with ``name`` added to ``__all__`` (sorted in among the lowercase names)."""
    tree = ast.parse(init_text)
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == ["__all__"]
            and isinstance(node.value, ast.List)
        ):
            items = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
            if len(items) != len(node.value.elts):
                raise StampError(f"{path}: __all__ is not a list of strings; add {name!r} by hand")
            at = next(
                (i for i, item in enumerate(items) if item[:1].islower() and item > name),
                len(items),
            )
            items.insert(at, name)
            lines = init_text.splitlines()
            tail = lines[node.end_lineno - 1][node.value.end_col_offset :]
            one_line = "__all__ = [" + ", ".join(f'"{i}"' for i in items) + "]"
            if node.lineno == node.end_lineno and len(one_line + tail) <= LINE_LIMIT:
                new = one_line + tail
            else:
                new = "__all__ = [\n" + "".join(f'    "{i}",\n' for i in items) + "]" + tail
            return _lines_replaced(init_text, node.lineno, node.end_lineno, new)
    raise StampError(f"{path}: no `__all__ = [...]` list")


def insert_dict_entry(text: str, variable: str, key: str, value: str, path: Path) -> str:
    """``text`` with ``"key": "value",`` appended to the dict literal assigned to ``variable``."""
    for node in ast.parse(text).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == variable:
            if not isinstance(node.value, ast.Dict):
                break
            line, indent, comma = _after_last_item(text, node.value.values, f"{path}: {variable}")
            if comma:
                text = _add_comma(text, line, node.value.values[-1].end_col_offset)
            entry = f'{indent}"{key}": "{value}",'
            if len(entry) > LINE_LIMIT:
                raise StampError(
                    f"the summary is too long for {variable} ({len(entry)} > {LINE_LIMIT} columns)"
                )
            return _insert_after_line(text, line, entry + "\n")
    raise StampError(f"{path}: no dict literal assigned to {variable}")


def insert_build_module(text: str, module: str) -> str | None:
    """``text`` with ``module`` sorted into the ``compile_group_for_hopper(...) == [...]`` list
    of a build test, or None if the file has no such list."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Compare) and len(node.comparators) == 1):
            continue
        left, right = node.left, node.comparators[0]
        if isinstance(left, ast.Call) and getattr(left.func, "id", "") == "sorted" and left.args:
            left = left.args[0]
        if not (
            isinstance(left, ast.Call)
            and getattr(left.func, "id", "") == "compile_group_for_hopper"
            and isinstance(right, ast.List)
            and all(isinstance(e, ast.Constant) for e in right.elts)
        ):
            continue
        items = sorted({e.value for e in right.elts} | {module})
        lines = text.splitlines()
        if right.lineno == right.end_lineno:
            head = lines[right.lineno - 1][: right.col_offset]
            tail = lines[right.lineno - 1][right.end_col_offset :]
            new = head + "[" + ", ".join(f'"{i}"' for i in items) + "]" + tail
            if len(new) <= LINE_LIMIT:
                return _lines_replaced(text, right.lineno, right.lineno, new)
        head = lines[right.lineno - 1][: right.col_offset]
        tail = lines[right.end_lineno - 1][right.end_col_offset :]
        indent = head[: len(head) - len(head.lstrip())]
        body = "".join(f'{indent}    "{i}",\n' for i in items)
        new = f"{head}[\n{body}{indent}]{tail}"
        return _lines_replaced(text, right.lineno, right.end_lineno, new)
    return None


def declared_cuda_modules(ops_dir: Path, files: dict[Path, str]) -> list[str]:
    """The uris (``<name>_cuda``) of the CUDA ModuleSpecs written literally in a group's op
    files (read as text: nothing is imported)."""
    uris = set()
    sources = {p: p.read_text() for p in sorted(ops_dir.glob("*.py"))} if ops_dir.is_dir() else {}
    sources.update({p: t for p, t in files.items() if p.parent == ops_dir and p.suffix == ".py"})
    for text in sources.values():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "ModuleSpec":
                kw = {k.arg: k.value for k in node.keywords}
                name, device = kw.get("name"), kw.get("device")
                if isinstance(name, ast.Constant) and (
                    device is None or (isinstance(device, ast.Constant) and device.value == "cuda")
                ):
                    uris.add(f"{name.value}_cuda")
    return sorted(uris)


# --- plans ----------------------------------------------------------------------------------------


class Plan:
    """Files to create and files to edit, read through the plan (so later steps see earlier
    ones); written at once by :meth:`write`."""

    def __init__(self) -> None:
        self.files: dict[Path, str] = {}
        self.created: set[Path] = set()

    def exists(self, path: Path) -> bool:
        return path in self.files or path.exists()

    def read(self, path: Path) -> str:
        return self.files[path] if path in self.files else path.read_text()

    def create(self, path: Path, text: str) -> None:
        if self.exists(path):
            raise StampError(f"{path.relative_to(ROOT)} exists; refusing to overwrite it")
        self.files[path] = text
        self.created.add(path)

    def edit(self, path: Path, text: str) -> None:
        self.files[path] = text

    def write(self) -> None:
        for path, text in self.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            verb = "created" if path in self.created else "edited "
            print(f"{verb} {path.relative_to(ROOT)}")


def dist_name(group: str) -> str:
    return "kernels-" + group.replace("_", "-")


def module_dir(group: str) -> Path:
    return PACKAGES / dist_name(group) / "src" / f"kernels_{group}"


def registered_groups(plan: Plan) -> dict[str, str]:
    """GROUP_SUMMARIES as the plan leaves it (read from the source, not imported)."""
    for node in ast.parse(plan.read(REGISTRY)).body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "GROUP_SUMMARIES":
            return ast.literal_eval(node.value)
    raise StampError(f"{REGISTRY}: no GROUP_SUMMARIES")


def _check_text(what: str, text: str, limit: int) -> None:
    if not text or len(text) > limit or re.search(r'["\\|\n]', text):
        raise StampError(
            f"{what} must be 1..{limit} characters without double quotes, backslashes, '|' or "
            f"newlines, got {text!r}"
        )


def _check_identifier(what: str, name: str, limit: int) -> None:
    if not _NAME.match(name) or keyword.iskeyword(name) or len(name) > limit:
        raise StampError(f"{what} must be snake_case, at most {limit} characters, got {name!r}")
    if name.startswith("jit") or "_jit" in name:
        raise StampError(f"{what} {name!r} carries a 'jit' prefix (reserved for kernels-jit)")


def parse_dtypes(text: str, cuda: bool) -> tuple[str, ...]:
    sys.path.insert(0, str(PACKAGES / "kernels-jit" / "src"))
    from kernels_jit.registry import DTYPE_NAMES

    dtypes = tuple(d.strip() for d in text.split(",") if d.strip())
    unknown = [d for d in dtypes if d not in DTYPE_NAMES]
    if not dtypes or unknown or len(set(dtypes)) != len(dtypes):
        raise StampError(f"--dtypes: distinct names from {sorted(DTYPE_NAMES)}, got {text!r}")
    if cuda and set(dtypes) - set(CUDA_DTYPES):
        raise StampError(
            f"--cuda: the CUDA template dispatches on {', '.join(CUDA_DTYPES)}; "
            f"got {', '.join(dtypes)}"
        )
    return dtypes


def plan_op(
    plan: Plan,
    group: str,
    name: str,
    *,
    cuda: bool,
    dtypes: tuple[str, ...],
    description: str,
) -> None:
    """Plan every file of a new op of ``group`` (which must be registered in the plan)."""
    _check_identifier("the op name", name, MAX_NAME)
    _check_text("--description", description, MAX_DESCRIPTION)
    if group not in registered_groups(plan):
        raise StampError(f"no group {group!r}; the groups are {sorted(registered_groups(plan))}")
    pkg = module_dir(group)
    init_path, reference_path = pkg / "__init__.py", pkg / "reference.py"
    init = plan.read(init_path)
    if name in declared_ops(init):
        raise StampError(f"the group {group!r} already has an op {name!r}")
    if name in RESERVED:
        raise StampError(f"the op name {name!r} is taken by the templates: {sorted(RESERVED)}")
    reference_text = plan.read(reference_path) if plan.exists(reference_path) else None
    if reference_text is not None and name in _bound_names(ast.parse(reference_text)):
        raise StampError(f"{reference_path.relative_to(ROOT)} already defines {name!r}")

    upper = name.upper()
    flags = {"cuda": cuda}
    bad = next(d for d in ("float64", "int64", "float32", "int32") if d not in dtypes)
    values = {
        "group": group,
        "name": name,
        "NAME": upper,
        "dist": dist_name(group),
        "dtype_list": ", ".join(dtypes),
        "dtype0": dtypes[0],
        "bad_dtype": bad,
        "summary": f"{description.rstrip('.')}.",
        "backend_choices": "``cuda`` or ``torch``" if cuda else "``torch``",
        "bench_dtype": "bfloat16" if "bfloat16" in dtypes else dtypes[0],
    }

    # The op file, its CUDA source, the reference.
    validation = ["check_out", "check_tensor", *(["is_row_view"] if cuda else [])]
    op_imports = {
        f"kernels_{group}": ["reference"],
        "kernels_jit.dispatch": ["Op"],
        "kernels_jit.validation": validation,
    }
    if cuda:
        op_imports |= {"kernels_jit": ["ModuleSpec"], "kernels_jit.loader": ["CompiledFunction"]}
    ops_init = pkg / "ops" / "__init__.py"
    if not plan.exists(ops_init):
        plan.create(ops_init, render("ops_init.py.tmpl", **values))
    plan.create(
        pkg / "ops" / f"{name}.py",
        render(
            "op.py.tmpl",
            flags,
            title=_title(f"{group}.{name}: ", description),
            imports=import_block(op_imports),
            **values,
        ),
    )
    if cuda:
        kinds = {
            "int32": "int32" in dtypes,
            "floats": bool(set(dtypes) & set(FLOATS)),
        }
        plan.create(pkg / "csrc" / f"{name}.cuh", render("op_cuda.cuh.tmpl", kinds, **values))
    function = render("reference_function.py.tmpl", **values)
    if reference_text is None:
        reference_text = render("group_reference.py.tmpl", **values)
        plan.create(reference_path, reference_text.rstrip() + "\n\n\n" + function)
    else:
        plan.edit(reference_path, reference_text.rstrip() + "\n\n\n" + function)

    # The one-line declaration and the export.
    uses_floats = "FLOATS" in _bound_names(ast.parse(init))
    if dtypes == FLOATS and uses_floats:
        dtypes_expr = "FLOATS"
    else:
        quoted = [f'"{d}"' for d in dtypes]
        dtypes_expr = f"({quoted[0]},)" if len(quoted) == 1 else f"({', '.join(quoted)})"
    decl = op_decl(name, description, "cuda" if cuda else "", dtypes_expr)
    init = insert_op_decl(init, decl, init_path)
    plan.edit(init_path, insert_all_name(init, name, init_path))

    # Tests: the op's own, and the group's build test (the new module in its list, or a new one).
    tests = ROOT / "tests" / group
    test_imports = {
        f"kernels_{group}": [name, "reference"],
        f"kernels_{group}.ops.{name}": ["DTYPES", upper],
        "shared.testing.compare": ["assert_close"],
        "shared.testing.inputs": ["poison", "randn", *(["misaligned"] if cuda else [])],
    }
    plan.create(
        tests / f"test_{name}.py",
        render("test_op.py.tmpl", flags, imports=import_block(test_imports), **values),
    )
    if cuda:
        edited = False
        for path in sorted(tests.glob("test_*.py")) if tests.is_dir() else []:
            new = insert_build_module(plan.read(path), f"{name}_cuda")
            if new is not None:
                plan.edit(path, new)
                edited = True
        if not edited:
            modules = declared_cuda_modules(pkg / "ops", plan.files)
            plan.create(
                tests / f"test_{group}_builds.py",
                render(
                    "test_builds.py.tmpl",
                    modules="\n".join(f'        "{m}",' for m in modules),
                    **values,
                ),
            )

    # The bench suite: the case function before cases(), and cases() yielding it.
    suite_path = ROOT / "shared" / "bench" / "suites" / f"{group}.py"
    if plan.exists(suite_path):
        suite = plan.read(suite_path)
        if f"{name}_cases" in _bound_names(ast.parse(suite)):
            raise StampError(f"{suite_path.relative_to(ROOT)} already defines {name}_cases")
    else:
        suite = render("bench_suite.py.tmpl", **values)
    suite = ensure_from_import(suite, f"kernels_{group}", [*([name] if cuda else []), "reference"])
    plan_suite = _add_case_function(suite, name, render("bench_case.py.tmpl", flags, **values))
    if plan.exists(suite_path):
        plan.edit(suite_path, plan_suite)
    else:
        plan.create(suite_path, plan_suite)


def _add_case_function(suite: str, name: str, function: str) -> str:
    tree = ast.parse(suite)
    cases = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "cases"), None
    )
    if cases is None:
        raise StampError("the bench suite has no cases(quick) function")
    start = min([cases.lineno] + [d.lineno for d in cases.decorator_list])
    suite = _insert_after_line(suite, cases.end_lineno, f"    yield from {name}_cases(quick)\n")
    suite = _insert_after_line(suite, start - 1, function.rstrip() + "\n\n\n")
    return _import_token_grid(suite, tree)


def _import_token_grid(suite: str, tree: ast.Module) -> str:
    """The case template iterates ``token_grid``: import it where a suite does not (in isort
    order: after the last ``from`` import of a module that sorts before ``shared.bench.shapes``)."""
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    bound = {a.asname or a.name for n in imports for a in n.names}
    if "token_grid" in bound or not imports:
        return suite
    module = "shared.bench.shapes"
    before = [n for n in imports if isinstance(n, ast.ImportFrom) and (n.module or "") < module]
    anchor = (before or imports)[-1]
    return _insert_after_line(suite, anchor.end_lineno, f"from {module} import token_grid\n")


def plan_group(
    plan: Plan,
    group: str,
    summary: str,
    *,
    cuda: bool,
    first_op: str,
    dtypes: tuple[str, ...],
) -> None:
    """Plan a whole group package (its first op is planned by :func:`plan_op`)."""
    _check_identifier("the group name", group, MAX_GROUP)
    _check_text("the summary", summary, LINE_LIMIT)
    if group in registered_groups(plan) or group in ("jit", "ops"):
        raise StampError(f"the group {group!r} exists (or is reserved)")
    for path in (
        PACKAGES / dist_name(group),
        ROOT / "tests" / group,
        ROOT / "shared" / "bench" / "suites" / f"{group}.py",
    ):
        if path.exists():
            raise StampError(f"{path.relative_to(ROOT)} exists; refusing to overwrite it")
    plan.edit(
        REGISTRY,
        insert_dict_entry(plan.read(REGISTRY), "GROUP_SUMMARIES", group, summary, REGISTRY),
    )
    pkg, dist = module_dir(group), dist_name(group)
    values = {"group": group, "dist": dist, "summary": summary, "first_op": first_op}
    flags = {"cuda": cuda}
    registry_names = ["lazy_ops", "op", "register_group", *(["FLOATS"] if dtypes == FLOATS else [])]
    init_imports = {
        "kernels_jit.registry": registry_names,
        f"kernels_{group}.version": ["__version__"],
    }
    plan.create(
        pkg / "__init__.py",
        render(
            "group_init.py.tmpl",
            title=_title(f"{dist}: ", summary),
            imports=import_block(init_imports),
            **values,
        ),
    )
    plan.create(pkg / "version.py", render("version.py.tmpl"))
    plan.create(pkg / "reference.py", render("group_reference.py.tmpl", **values))
    plan.create(pkg / "ops" / "__init__.py", render("ops_init.py.tmpl", **values))
    readme_summary = textwrap.fill(f"{summary.rstrip('.')}.", width=LINE_LIMIT)
    plan.create(
        PACKAGES / dist / "README.md",
        render("group_readme.md.tmpl", flags, **(values | {"summary": readme_summary})),
    )
    plan.create(PACKAGES / dist / "CHANGELOG.md", render("changelog.md.tmpl", flags, **values))


def regenerate() -> None:
    """Rerun ``python -m shared.release.generate`` in a fresh process (it reads the group list
    and the op declarations at import time, which the stamping just changed)."""
    result = subprocess.run([sys.executable, "-m", "shared.release.generate"], cwd=ROOT)
    if result.returncode:
        raise SystemExit(f"stamp: the generation failed (exit {result.returncode})")


def new_op(
    group: str,
    name: str,
    *,
    cuda: bool,
    dtypes: str,
    description: str | None,
) -> int:
    plan = Plan()
    plan_op(
        plan,
        group,
        name,
        cuda=cuda,
        dtypes=parse_dtypes(dtypes, cuda),
        description=description or DEFAULT_DESCRIPTION,
    )
    plan.write()
    regenerate()
    print(f"stamped {group}.{name}: search its files for TODO, then run pytest tests/{group}")
    return 0


def new_group(
    group: str,
    summary: str,
    *,
    first_op: str,
    cuda: bool,
    dtypes: str,
    description: str | None,
) -> int:
    plan = Plan()
    parsed = parse_dtypes(dtypes, cuda)
    plan_group(plan, group, summary, cuda=cuda, first_op=first_op, dtypes=parsed)
    plan_op(
        plan,
        group,
        first_op,
        cuda=cuda,
        dtypes=parsed,
        description=description or DEFAULT_DESCRIPTION,
    )
    plan.write()
    regenerate()
    print(f"stamped the group {group}: search packages/{dist_name(group)} for TODO")
    return 0
