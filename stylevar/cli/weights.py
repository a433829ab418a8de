"""`stylevar weights status|path|fetch`: the external weights of stylevar.loaders.weights."""
from __future__ import annotations

import argparse
import os
import sys

from stylevar.cli.command import Command


def status_rows() -> list[dict[str, str]]:
    """One row per registered weight: name, present or missing, where, who uses it, where it comes from."""
    from stylevar.loaders.weights import REGISTRY
    rows = []
    for w in REGISTRY.values():
        found = w.find()
        rows.append({
            "name": w.name,
            "status": "present" if found else "missing",
            "path": str(found or w.search_paths()[0]),
            "used_by": w.used_by,
            "source": w.hub_file.url if w.hub_file else (w.url or "several downloads"),
        })
    return rows


def status(args: argparse.Namespace) -> int:
    from stylevar.loaders import hub
    from stylevar.loaders.hub import home
    from stylevar.loaders.weights import torch_hub_dir
    rows = status_rows()
    print(f"STYLEVAR_HOME = {home()}\ntorch hub dir = {torch_hub_dir()}\nHF hub cache  = {hub.cache_dir()}\n")
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        print(f"{r['name']:<{width}}  {r['status']:<7}  {r['path']}\n{'':<{width}}  {'':<7}  used by: {r['used_by']}")
    n_missing = sum(r["status"] == "missing" for r in rows)
    print(f"\n{len(rows) - n_missing} present, {n_missing} missing; fetch with: stylevar weights fetch NAME|all")
    return 0


def fetch(args: argparse.Namespace) -> int:
    from stylevar.loaders.weights import REGISTRY, fetch_weight
    names = list(REGISTRY) if args.names == ["all"] else args.names
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        print(f"error: unknown weight(s) {', '.join(unknown)}; registered: {', '.join(REGISTRY)}", file=sys.stderr)
        return 2
    failed = 0
    for name in names:
        weight = REGISTRY[name]
        try:
            result = fetch_weight(weight, mirror=args.mirror, force=args.force, progress=not args.quiet)
        except (OSError, ValueError) as e:  # URLError is an OSError; ChecksumError a ValueError
            print(f"{name}: FAILED: {e}", file=sys.stderr)
            failed += 1
            continue
        if result.skipped:
            print(f"{name}: present at {result.path}")
        else:
            print(f"{name}: fetched to {result.path} (sha256 {', '.join(result.sha256)})")
    return 1 if failed else 0


def path(args: argparse.Namespace) -> int:
    from stylevar.loaders.weights import REGISTRY, MissingWeightError, resolve
    if args.name not in REGISTRY:
        print(f"error: unknown weight {args.name}; registered: {', '.join(REGISTRY)}", file=sys.stderr)
        return 2
    try:
        print(resolve(args.name))
    except MissingWeightError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from stylevar.loaders.weights import REGISTRY  # no torch
    sub = parser.add_subparsers(dest="weights_command", required=True, metavar="ACTION")
    p_status = sub.add_parser("status", help="list every registered weight and whether it is present")
    p_status.set_defaults(func=status)
    p_path = sub.add_parser("path", help="print where a present weight is (for scripts: --init-var \"$(...)\")")
    p_path.add_argument("name", metavar="NAME", help=f"any of: {', '.join(REGISTRY)}")
    p_path.set_defaults(func=path)
    p_fetch = sub.add_parser("fetch", help="download weights (needs internet; checksums verified where published)")
    p_fetch.add_argument("names", nargs="+", metavar="NAME", help=f"'all' or any of: {', '.join(REGISTRY)}")
    p_fetch.add_argument("--mirror", default=os.environ.get("STYLEVAR_WEIGHTS_MIRROR"),
                         help="base URL serving the files under their own names, written below STYLEVAR_HOME or "
                              "TORCH_HOME (default: the environment's STYLEVAR_WEIGHTS_MIRROR); without it Hugging Face files come through "
                              "huggingface_hub into its cache (a mirror of the Hub: HF_ENDPOINT)")
    p_fetch.add_argument("--force", action="store_true", help="download again even if present")
    p_fetch.add_argument("--quiet", action="store_true", help="no progress bars")
    p_fetch.set_defaults(func=fetch)


COMMAND = Command("weights", "list and fetch external weights (VGG, LPIPS, DreamSim, CLIP, ...)", add_arguments)
