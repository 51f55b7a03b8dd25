"""What needs the service's settings: the operator's limits (each refusal names the field,
the value and the limit), corpora from where the operator allows (`resolve_corpus`), and
`check_job`."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple

from cost_model import (
    flops_for_tokens,
    tokens_for_budget,
)
from nas_service.settings import Settings
from nas_service.spec.candidates import (
    Candidate,
    _fmt,
    _over,
    _total_params,
    enumerate_candidates,
    space_size,
)
from nas_service.spec.fields import SpecError, _check_text
from nas_service.spec.model import JobSpec
from nas_service.spec.space import CandidateSpace

# -- corpora ----------------------------------------------------------------------------------
_CORPUS = "training.corpus"
_BUILTIN = "builtin"  # workers.data.BUILTIN (not imported here: workers.data loads torch)


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def resolve_corpus(corpus: str | None, settings: Settings) -> str | None:
    """Where `training.corpus` may be read from, as an absolute path with symbolic links
    resolved, or None for the built-in corpus (None or "builtin").

    A name registered in `settings.corpora` gives that path (a relative one is taken inside
    `settings.data_dir`). Anything else is a path inside `settings.data_dir`: relative to it,
    or absolute and lying in it. It must exist, be a regular file or a folder, and still lie
    inside the data folder once every symbolic link is followed. Otherwise `SpecError` on
    "training.corpus" says why, and never whether a path outside the data folder exists.
    The service calls it in `check_job`; the runner calls it again before training."""
    if corpus is None:
        return None
    try:
        _check_text(corpus)
    except ValueError as exc:
        raise SpecError([(_CORPUS, str(exc))]) from None
    if corpus in settings.corpora:
        return _registered_corpus(corpus, settings)
    if corpus == _BUILTIN:
        return None
    shown = repr(corpus)
    registered = ", ".join(sorted(settings.corpora))
    outside = SpecError(
        [
            (
                _CORPUS,
                f"{shown} is not a registered corpus and not a path inside the data folder"
                + (f" (registered: {registered})" if registered else ""),
            )
        ]
    )
    escapes = SpecError([(_CORPUS, f"{shown} leads outside the data folder (a symbolic link)")])
    root_given = settings.data_dir.expanduser().absolute()
    root = Path(os.path.realpath(root_given))
    raw = Path(corpus)
    target = raw if raw.is_absolute() else root / raw
    lexical = Path(os.path.normpath(target))
    if not (_inside(lexical, root) or _inside(lexical, Path(os.path.normpath(root_given)))):
        raise outside  # decided on the text alone: nothing outside is looked at
    try:
        real = target.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, a loop, a file used as a folder, no access
        try:
            loose = target.resolve(strict=False)
        except (OSError, RuntimeError):
            loose = lexical
        if not _inside(loose, root):
            raise escapes from None
        raise SpecError(
            [
                (
                    _CORPUS,
                    f"{shown} is not a registered corpus and does not exist in the data folder"
                    + (f" (registered: {registered})" if registered else ""),
                )
            ]
        ) from None
    if not _inside(real, root):
        raise escapes
    if real == root:
        raise SpecError(
            [(_CORPUS, f"{shown} is the data folder itself; name a file or folder inside it")]
        )
    if not (real.is_file() or real.is_dir()):
        raise SpecError([(_CORPUS, f"{shown} is not a regular file or a folder")])
    return str(real)


class CorpusLocation(NamedTuple):
    """Where the workers read a corpus: `path` (relative, "/"-separated) beneath the folder
    `root` (absolute, links resolved), opened with no symbolic link followed, so a name
    swapped for a link after the check is refused, not read; shown as `path`."""

    root: str
    path: str


def locate_corpus(corpus: str | None, settings: Settings) -> CorpusLocation | None:
    """`resolve_corpus` as the workers read it: beneath the data folder, or, for a
    registered corpus, beneath its own parent folder. None for the built-in corpus."""
    real = resolve_corpus(corpus, settings)
    if real is None:
        return None
    if corpus in settings.corpora:
        return CorpusLocation(os.path.dirname(real), os.path.basename(real))
    root = os.path.realpath(settings.data_dir.expanduser().absolute())
    return CorpusLocation(root, Path(os.path.relpath(real, root)).as_posix())


def _registered_corpus(name: str, settings: Settings) -> str:
    path = settings.corpora[name].expanduser()
    if not path.is_absolute():
        path = settings.data_dir.expanduser().absolute() / path
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        real = None
    if real is None or not (real.is_file() or real.is_dir()):
        raise SpecError(
            [(_CORPUS, f"the registered corpus {name!r} is not available on this service")]
        )
    return str(real)


# -- the job against the settings -------------------------------------------------------------
def _limits(spec: JobSpec, settings: Settings) -> list[tuple[str, str]]:
    """Every operator limit that can be checked without building a candidate (nothing here
    grows with a range's width)."""
    errors: list[tuple[str, str]] = []
    s = settings
    if spec.n_trials > s.max_trials:
        errors.append(_over("n_trials", spec.n_trials, s.max_trials))
    budgets = spec.budget.raw_values()
    field = f"budget.{spec.budget.kind}"
    limit = s.max_budget_flops if spec.budget.kind == "flops" else s.max_budget_tokens
    if max(budgets) > limit:
        errors.append(_over(field, max(budgets), limit))
    if len(budgets) > s.max_axis_values:
        errors.append(
            (field, f"{len(budgets)} values, over the limit of {s.max_axis_values} per axis")
        )
    if spec.max_concurrent > s.max_concurrent_trials:
        errors.append(_over("max_concurrent", spec.max_concurrent, s.max_concurrent_trials))
    if spec.seeds > s.max_seeds:
        errors.append(_over("seeds", spec.seeds, s.max_seeds))
    if spec.confirm_seeds > s.max_seeds:
        errors.append(_over("confirm.seeds", spec.confirm_seeds, s.max_seeds))
    errors += _training_limits(spec, s)
    if spec.cluster not in s.clusters:
        errors.append(
            (
                "cluster",
                f"unknown cluster {spec.cluster!r}; configured: {', '.join(s.clusters)}",
            )
        )
    size = space_size(spec)
    if size > s.max_candidates_enumerated:
        errors.append(
            (
                "space",
                f"more than {s.max_candidates_enumerated} candidates ({_fmt(size)}); "
                "narrow the space",
            )
        )
    space = spec.space
    for axis in CandidateSpace(spec).axes():
        if axis.count > s.max_axis_values:
            errors.append(
                (
                    f"space.{axis.field}",
                    f"{_fmt(axis.count)} values, over the limit of {s.max_axis_values} per axis",
                )
            )
        if axis.ceiling is not None and axis.largest > axis.ceiling(s):
            errors.append(_over(f"space.{axis.field}", axis.largest, axis.ceiling(s)))
    if space.head_dim > s.max_d_model:
        errors.append(_over("space.head_dim", space.head_dim, s.max_d_model))
    if space.params_target is not None and space.params_target.params > s.max_params:
        errors.append(_over("space.params_target.params", space.params_target.params, s.max_params))
    training, cost = spec.training, spec.cost
    if training.seq_len > s.max_seq_len:
        errors.append(_over("training.seq_len", training.seq_len, s.max_seq_len))
    if training.batch_size > s.max_batch_size:
        errors.append(_over("training.batch_size", training.batch_size, s.max_batch_size))
    if training.threads is not None and training.threads > s.max_threads:
        errors.append(_over("training.threads", training.threads, s.max_threads))
    if cost.seq_len is not None and cost.seq_len > s.max_seq_len:
        errors.append(_over("cost.seq_len", cost.seq_len, s.max_seq_len))
    if cost.decode_context is not None and cost.decode_context > s.max_seq_len:
        errors.append(_over("cost.decode_context", cost.decode_context, s.max_seq_len))
    if cost.micro_batch > s.max_batch_size:
        errors.append(_over("cost.micro_batch", cost.micro_batch, s.max_batch_size))
    try:
        resolve_corpus(training.corpus, settings)
    except SpecError as exc:
        errors.extend(exc.errors)
    return errors


def _training_limits(spec: JobSpec, s: Settings) -> list[tuple[str, str]]:
    """The values of each training axis (joint choices and `tune` lists) and the training
    runs of the job, n_trials × (seeds × the product of the `tune` lists' lengths + the
    confirmation seeds) (counted, never built)."""
    errors: list[tuple[str, str]] = []
    lists = {f"training.{n}": v for n, v in spec.training.searched().items() if isinstance(v, list)}
    if spec.tune is not None:
        lists |= {f"tune.{n}": v for n, v in spec.tune.axes().items()}
    for field, values in lists.items():
        if len(values) > s.max_axis_values:
            errors.append(
                (field, f"{len(values)} values, over the limit of {s.max_axis_values} per axis")
            )
    if spec.runs > s.max_job_runs:
        if spec.confirm is not None:
            field = "tune"
            how = (
                f"n_trials × (seeds × tune settings + confirm.seeds) = {spec.n_trials} × "
                f"({spec.seeds} × {_fmt(spec.tune_size)} + {spec.confirm_seeds})"
            )
        elif spec.tune is not None:
            field = "tune"
            how = f"n_trials × seeds × tune settings = {spec.n_trials} × {spec.seeds} × "
            how += f"{_fmt(spec.tune_size)}"
        else:
            field, how = "n_trials", f"n_trials × seeds = {spec.n_trials} × {spec.seeds}"
        errors.append(
            (
                field,
                f"{how} = {_fmt(spec.runs)} training runs, over the limit of "
                f"{_fmt(s.max_job_runs)} per job",
            )
        )
    return errors


def _describe(candidate: Candidate) -> str:
    return ", ".join(f"{k}={v}" for k, v in candidate.params.items())


def _candidate_limits(
    spec: JobSpec, valid: list[Candidate], settings: Settings
) -> list[tuple[str, str]]:
    """The limits on what the candidates turned out to be: width, parameters, and the
    estimated compute of the whole job."""
    errors: list[tuple[str, str]] = []
    archs = [(c, c.arch) for c in valid if c.arch is not None]
    width_field = "space.aspect_ratio" if spec.space.aspect_ratio is not None else "space"
    if spec.space.params_target is not None:
        width_field = "space.params_target"
    widest, widest_arch = max(archs, key=lambda t: t[1].d_model)
    if widest_arch.d_model > settings.max_d_model:
        errors.append(
            (
                width_field,
                f"the candidate {_describe(widest)} has d_model {widest_arch.d_model}, "
                f"over the limit of {settings.max_d_model}",
            )
        )
    params = [(_total_params(a), c) for c, a in archs]
    most, biggest = max(params, key=lambda t: t[0])
    if most > settings.max_params:
        errors.append(
            (
                "space",
                f"the candidate {_describe(biggest)} has {most:.3g} parameters, over the "
                f"limit of {_fmt(settings.max_params)}",
            )
        )
    budgets = spec.budget.raw_values()
    if spec.budget.kind == "flops":
        per_run = float(max(budgets))
    else:
        per_run = max(flops_for_tokens(a, int(max(budgets))) for _, a in archs)
    job = spec.runs * per_run  # the job's training runs × the largest run
    if job > settings.max_job_flops:
        runs = "n_trials × seeds" + (" × tune settings" if spec.tune is not None else "")
        if spec.confirm is not None:
            runs = "n_trials × (seeds × tune settings + confirm.seeds)"
        errors.append(
            (
                "budget",
                f"the job's estimated compute, {runs} × {per_run:.3g} FLOPs = "
                f"{job:.3g} FLOPs, is over the limit of {_fmt(settings.max_job_flops)}",
            )
        )
    return errors


def check_job(spec: JobSpec, settings: Settings) -> list[Candidate]:
    """What needs the settings and the cost model. Returns the valid candidates; raises
    `SpecError` for anything over the operator's limits (n_trials, budget, concurrency,
    seeds, the size of the space and of each axis (training axes and `tune` lists included),
    the training runs of the job (n_trials × (seeds × tune settings + confirm.seeds)),
    depth, width, heads, sequence length, batch size, threads, parameters per candidate, the
    estimated compute of the job: runs × FLOPs of the largest run), an unknown cluster, a
    corpus from outside the data folder, a space with no valid candidate, or a budget too
    small for one optimizer step of the smallest candidate; with a `fidelity` section, a
    first rung too small for one optimizer step, fewer steps than rungs (under `reuse:
    checkpoint`) and an artifact store (`settings.artifact_store`) that cannot be written,
    read and cleaned (checked last: it may be remote).

    Everything that can be checked arithmetically is checked before any candidate is built,
    so a hostile range costs nothing."""
    errors = _limits(spec, settings)
    if errors:
        raise SpecError(errors)
    candidates = list(enumerate_candidates(spec, settings.max_candidates_enumerated))
    valid = [c for c in candidates if c.arch is not None]
    if not valid:
        reasons = sorted({c.reason for c in candidates})
        raise SpecError([("space", "no valid candidate: " + "; ".join(reasons[:3]))])
    errors = _candidate_limits(spec, valid, settings)
    if errors:
        raise SpecError(errors)
    budgets = spec.budget.values()
    if spec.stop is not None:
        _check_stop(spec, valid, len(budgets), "stop.optimum_interval")
    if spec.sampler == "optimum":
        _check_stop(spec, valid, len(budgets), "sampler")
    step_tokens = spec.training.batch_size * spec.training.seq_len
    if spec.budget.kind == "flops":
        bought = [tokens_for_budget(c.arch, min(budgets)) for c in valid if c.arch]
        best = max(bought)
        if best < step_tokens:
            raise SpecError(
                [
                    (
                        "budget.flops",
                        f"buys at most {best} tokens, fewer than one optimizer step "
                        f"({step_tokens} = batch_size × seq_len) of the smallest candidate",
                    )
                ]
            )
    elif min(budgets) < step_tokens:
        raise SpecError(
            [
                (
                    "budget.tokens",
                    f"{int(min(budgets))} is fewer than one optimizer step ({step_tokens})",
                )
            ]
        )
    else:
        bought = [int(min(budgets))]
    if spec.fidelity is not None:
        # the candidate with the fewest tokens among those the budget trains at all
        fewest = min(t for t in bought if t >= step_tokens)
        _check_first_rung(spec.fidelity.rungs[0], fewest, spec)
        if spec.fidelity.reuse == "checkpoint":
            _check_rung_stops(len(spec.fidelity.rungs), fewest // step_tokens)
        _check_store(settings)
    return valid


def _check_stop(spec: JobSpec, valid: list[Candidate], budgets: int, field: str) -> None:
    """`stop.optimum_interval` and `sampler: optimum` fit a quadratic in ln(d_model/L_b) per
    variant at one budget: every variant needs three shapes at least."""
    if budgets > 1:
        raise SpecError([(field, "the optimum is located at one budget; list a single one")])
    shapes: dict[str, set[float]] = {}
    for c in valid:
        if c.arch is not None:
            shapes.setdefault(c.arch.variant, set()).add(c.arch.d_model / c.arch.n_layers)
    few = {v: len(r) for v, r in sorted(shapes.items()) if len(r) < 3}
    if few:
        named = ", ".join(f"{v} has {n}" for v, n in few.items())
        raise SpecError(
            [(field, f"an optimum needs at least 3 shapes (d_model/L_b) per variant; {named}")]
        )


def _check_first_rung(rung: float, tokens: int, spec: JobSpec) -> None:
    """The first rung buys at least one optimizer step of the candidate with the fewest
    tokens (the largest under a FLOPs budget, at the smallest budget): below it the rung
    would train a whole step anyway and no longer be the fraction asked for."""
    step_tokens = spec.training.batch_size * spec.training.seq_len
    if tokens * rung < step_tokens:
        raise SpecError(
            [
                (
                    "fidelity.rungs",
                    f"the first rung, {rung:g} of the budget, is {int(tokens * rung)} tokens "
                    f"of the candidate with the fewest ({tokens}), fewer than one optimizer "
                    f"step ({step_tokens} = batch_size × seq_len); raise it to at least "
                    f"{step_tokens / tokens:.3g}, or raise the budget",
                )
            ]
        )


def _check_rung_stops(rungs: int, steps: int) -> None:
    """Under `reuse: checkpoint` each rung ends the main line at a step of its own
    (`rungs.rung_stops`): the candidate with the fewest steps needs one per rung."""
    if steps < rungs:
        raise SpecError(
            [
                (
                    "fidelity.rungs",
                    f"the candidate with the fewest tokens trains {steps} optimizer steps, "
                    f"fewer than the {rungs} rungs (each ends at a step of its own): use "
                    "fewer rungs, or raise the budget",
                )
            ]
        )


#: A protocol of an fsspec URL (`s3`, `gcs`, `memory`…): the only part of it a message shows.
_PROTOCOL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}")


def _store_kind(url: str) -> str | None:
    """The protocols of an fsspec URL ("s3", "simplecache::s3"), or None for a local folder
    (a path, or `file://`); never its host, bucket, path or credentials."""
    parts = url.split("::")
    protocols = [p.split("://", 1)[0] if "://" in p else p for p in parts[:-1]]
    if "://" in parts[-1]:
        protocols.append(parts[-1].split("://", 1)[0])
    protocols = [p if _PROTOCOL.fullmatch(p) else "?" for p in protocols]
    if not protocols or protocols == ["file"]:
        return None
    return "::".join(protocols)


def _scrub(reason: str, url: str) -> str:
    """`reason` without the store's URL or path, nor anything like user:password@."""
    forms = {url, url.rstrip("/"), url.split("://", 1)[-1].rstrip("/")}
    if _store_kind(url) is None:
        local = url.removeprefix("file://")
        forms |= {local.rstrip("/"), os.path.abspath(os.path.expanduser(local))}
    for form in sorted((f for f in forms if f), key=len, reverse=True):
        reason = reason.replace(form, "<store>")
    return re.sub(r"//[^/\s@]*@", "//", reason)


def _check_store(settings: Settings) -> None:
    """The operator's artifact store takes a write, a read and a delete (a multi-fidelity
    job keeps its checkpoints there). The message names the store only by its kind: its URL
    may hold credentials."""
    from workers.store import ArtifactStore  # fsspec: loaded only for a fidelity job

    url = settings.artifact_store
    kind = _store_kind(url)
    try:
        ArtifactStore(url).check()
    except Exception as exc:  # any failure of a third-party filesystem: a refusal, not a 500
        reason = getattr(exc, "reason", None) or f"{type(exc).__name__}: {exc}"
        where = "folder is not writable" if kind is None else f"({kind}) is not usable"
        raise SpecError(
            [("fidelity", f"the operator's artifact store {where}: {_scrub(reason, url)}")]
        ) from None
