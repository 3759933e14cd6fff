"""Render and lint a Helm chart with Helm's own engine, without a helm binary.

helm-python-sdk (PyPI, pinned and installed into the venv by setup-host.sh) binds Helm v4's Go
library (libhelm_c.so, shipped in its wheel): the same template engine, values coalescing and
linter as `helm template` / `helm lint`. Run it with the venv's python:

    python helm-chart.py render CHART [--values JSON] [--release NAME] [--namespace NS]
            [--api-versions GROUP/VERSION]... [--kube-version V]
        every rendered manifest (NOTES.txt left out) as one YAML stream on stdout, in template
        order, each document headed by `# Source: <template>` as `helm template` does; the
        cluster's API versions (`.Capabilities.APIVersions`) are Helm's built-in ones plus those
        given, as `helm template --api-versions` does; values are checked against the chart's
        values.schema.json first (exit 1 with Helm's message naming the key)
    python helm-chart.py lint CHART [--values JSON] [--kube-version V]...
        `helm lint --strict`: exit 1 on any warning or error (info findings are printed only)
    python helm-chart.py notes CHART [--values JSON] [--release NAME] [--namespace NS]
            [--api-versions GROUP/VERSION]...
        the rendered NOTES.txt
"""

from __future__ import annotations

import argparse
import json
import sys

import helm_python as helm
from helm_python import _native


def render(args: argparse.Namespace, notes: bool) -> int:
    values = json.loads(args.values) if args.values else None
    # Chart.render() passes no API or Kubernetes versions; the C library's own options do
    # (helm-c-sdk's render options: api_versions, kube_version; the wheel is pinned by
    # setup-host.sh), as `helm template` flags.
    opts = {"name": args.release, "namespace": args.namespace, "is_install": True}
    if args.api_versions:
        opts["api_versions"] = args.api_versions
    if args.kube_version:
        opts["kube_version"] = args.kube_version[-1]
    with helm.Chart.load(args.chart) as chart:
        rendered = _native.call_string(
            "helm_render",
            chart._raw(),
            json.dumps(values) if values is not None else None,
            json.dumps(opts),
        )
    out: dict[str, str] = json.loads(rendered)
    for name in sorted(out):
        is_notes = name.endswith("/NOTES.txt")
        if is_notes != notes:
            continue
        text = out[name]
        if notes:
            sys.stdout.write(text)
            continue
        # A template may hold several documents, or none (a disabled toggle).
        for doc in text.split("\n---\n"):
            if doc.strip() and any(
                line.strip() and not line.lstrip().startswith("#") for line in doc.splitlines()
            ):
                sys.stdout.write(f"---\n# Source: {name}\n{doc.strip()}\n")
    return 0


def lint(args: argparse.Namespace) -> int:
    values = json.loads(args.values) if args.values else None
    failed = False
    for version in args.kube_version or [None]:
        report = helm.lint(
            args.chart, values, strict=True, namespace=args.namespace, kube_version=version
        )
        label = f"Kubernetes {version}" if version else "default Kubernetes version"
        for m in report.get("messages") or []:
            severity = {1: "INFO", 2: "WARNING", 3: "ERROR"}.get(m.get("severity"), "UNKNOWN")
            print(f"[{severity}] {m.get('path')}: {m.get('error')} ({label})")
            failed |= severity != "INFO"
        for e in report.get("errors") or []:
            print(f"[ERROR] {e} ({label})")
            failed = True
        if not failed:
            print(f"lint: {args.chart}: no warnings or errors ({label}, strict)")
    return 1 if failed else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=["render", "lint", "notes"])
    p.add_argument("chart")
    p.add_argument("--values", help="values as a JSON object, over the chart's values.yaml")
    p.add_argument("--release", default="nri-resize")
    p.add_argument("--namespace", default="kube-system")
    p.add_argument(
        "--kube-version",
        action="append",
        help="lint: against this version (v1.33.0), repeatable; render: the cluster's (the last)",
    )
    p.add_argument(
        "--api-versions",
        action="append",
        help="render, notes: an API version the cluster serves (monitoring.coreos.com/v1), repeatable",
    )
    args = p.parse_args()
    try:
        if args.command == "lint":
            return lint(args)
        return render(args, notes=args.command == "notes")
    except helm.HelmError as e:
        print(f"helm: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
