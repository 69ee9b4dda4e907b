#!/usr/bin/env python3
"""Renders docs/api.md, the API reference of dbop's custom resources, from crds/dbop.dev.yaml.

    python3 docs/gen-api.py > docs/api.md

The CRDs are generated from the Rust API types (src/api/, `make crds`), so this reference says
exactly what the API server enforces: every field path, its type, whether it is required, its
default, its validation (enum, ranges, lengths, pattern, CEL rules with their messages) and its
description (the doc comment of the Rust field, which is also what `kubectl explain` shows), plus
the printer columns, names and short names of each kind.

Needs Python 3.8+ and PyYAML (`pip install pyyaml`). Output is deterministic: the same CRDs give
the same bytes.
"""

import json
import os
import sys

try:
    import yaml
except ImportError:  # pragma: no cover - a message for people, not a code path to test
    sys.exit("gen-api.py needs PyYAML: pip install pyyaml")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRDS = os.path.join(ROOT, "crds", "dbop.dev.yaml")

# Kubernetes' own types embedded in the API: documented upstream, so one row each instead of
# their (long) schemas.
UPSTREAM = {
    "spec.resources": (
        "core/v1 ResourceRequirements",
        "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#resources",
    ),
    "status.conditions": (
        "[]meta/v1 Condition",
        "https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/object-meta/#Condition",
    ),
}


def cell(text):
    """Text fit for one Markdown table cell: one line, pipes escaped."""
    paragraphs = [" ".join(p.split()) for p in str(text).strip().split("\n\n")]
    return "<br><br>".join(p for p in paragraphs if p).replace("|", "\\|")


def code(text):
    """Inline code for a table cell (pipes escaped, as GitHub tables require even in code)."""
    text = str(text)
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text}{pad}{fence}".replace("|", "\\|")


def number(value):
    """1.0 -> 1, as the generator writes integer bounds as floats."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def type_of(schema):
    """A short type: string, integer (int32), []object, map[string]string, int-or-string…"""
    if schema.get("x-kubernetes-int-or-string"):
        return "int-or-string"
    kind = schema.get("type", "any")
    if kind == "array":
        return "[]" + type_of(schema.get("items", {}))
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return "map[string]" + type_of(schema["additionalProperties"])
    if schema.get("format"):
        return f"{kind} ({schema['format']})"
    return kind


def validations(schema):
    """Every rule the API server checks on this node, as Markdown fragments."""
    out = []
    if "enum" in schema:
        out.append("one of " + ", ".join(code(v) for v in schema["enum"]))
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if lo is not None and hi is not None:
        out.append(f"{number(lo)} ≤ value ≤ {number(hi)}")
    elif lo is not None:
        out.append(f"≥ {number(lo)}")
    elif hi is not None:
        out.append(f"≤ {number(hi)}")
    lo, hi = schema.get("minLength"), schema.get("maxLength")
    if lo is not None and hi is not None:
        out.append(f"length {lo}–{hi}")
    elif lo is not None:
        out.append(f"length ≥ {lo}")
    elif hi is not None:
        out.append(f"length ≤ {hi}")
    for key, word in (("minItems", "items ≥"), ("maxItems", "items ≤")):
        if key in schema:
            out.append(f"{word} {schema[key]}")
    if "pattern" in schema:
        out.append("pattern " + code(schema["pattern"]))
    for rule in schema.get("x-kubernetes-validations", []):
        when = " (on update)" if "oldSelf" in rule["rule"] else ""
        text = f"CEL{when} {code(rule['rule'])}"
        if rule.get("message"):
            text += f": “{cell(rule['message'])}”"
        out.append(text)
    return out


def rows(schema, path, required, out):
    """Appends one row per field under `schema` (depth first, in the CRD's order)."""
    upstream = UPSTREAM.get(path)
    default = code(json.dumps(schema["default"])) if "default" in schema else ""
    description = cell(schema.get("description", ""))
    kind = type_of(schema)
    if upstream:
        kind = f"[{upstream[0]}]({upstream[1]})"
    out.append(
        "| {} | {} | {} | {} | {} | {} |".format(
            code(path),
            kind if upstream else code(kind),
            "yes" if required else "",
            default,
            "<br>".join(validations(schema)),
            description,
        )
    )
    if upstream:
        return
    target = schema
    suffix = ""
    if schema.get("type") == "array" and isinstance(schema.get("items"), dict):
        target, suffix = schema["items"], "[]"
    elif isinstance(schema.get("additionalProperties"), dict):
        target, suffix = schema["additionalProperties"], "{}"
    if target is not schema and target.get("properties") is None:
        return
    needed = set(target.get("required", []))
    for name, child in (target.get("properties") or {}).items():
        rows(child, f"{path}{suffix}.{name}", name in needed, out)


def fields_table(schema, path, required):
    out = [
        "| Field | Type | Required | Default | Validation | Description |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    rows(schema, path, required, out)
    return out


def render_kind(crd):
    spec = crd["spec"]
    names = spec["names"]
    kind = names["kind"]
    lines = [f"## {kind}", ""]
    for version in spec["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        lines += [cell(schema.get("description", "")), ""]
        facts = [
            ("API version", code(f"{spec['group']}/{version['name']}")),
            ("Kind", code(kind)),
            ("Scope", spec["scope"]),
            ("Plural", code(names["plural"])),
            ("Singular", code(names.get("singular", kind.lower()))),
            ("Short names", ", ".join(code(n) for n in names.get("shortNames", [])) or "none"),
            ("Categories", ", ".join(code(n) for n in names.get("categories", [])) or "none"),
            (
                "Subresources",
                ", ".join(code(n) for n in sorted(version.get("subresources", {}))) or "none",
            ),
            (
                "Served / storage version",
                f"{str(version.get('served', False)).lower()} / "
                f"{str(version.get('storage', False)).lower()}",
            ),
        ]
        lines += ["| | |", "| --- | --- |"]
        lines += [f"| {k} | {v} |" for k, v in facts]
        lines.append("")

        object_rules = validations(
            {"x-kubernetes-validations": schema.get("x-kubernetes-validations", [])}
        )
        if object_rules:
            lines += ["Rules on the whole object:", ""]
            lines += [f"- {r}" for r in object_rules]
            lines.append("")

        columns = version.get("additionalPrinterColumns", [])
        if columns:
            lines += [
                f"### `kubectl get {names['plural']}` columns",
                "",
                "| Column | Type | JSONPath | Description |",
                "| --- | --- | --- | --- |",
            ]
            for c in columns:
                lines.append(
                    f"| {cell(c['name'])} | {c['type']} | {code(c['jsonPath'])} | "
                    f"{cell(c.get('description', ''))} |"
                )
            lines.append("")

        needed = set(schema.get("required", []))
        props = schema.get("properties", {})
        for part, title in (("spec", "Spec"), ("status", "Status")):
            if part not in props:
                continue
            lines += [f"### {kind} {title.lower()}", ""]
            if part == "status":
                lines += [
                    "Written by dbop only (the `status` subresource); read it, never set it.",
                    "",
                ]
            lines += fields_table(props[part], part, part in needed)
            lines.append("")
    return lines


def main():
    with open(CRDS, encoding="utf-8") as f:
        crds = [d for d in yaml.safe_load_all(f) if d]
    crds = [d for d in crds if d.get("kind") == "CustomResourceDefinition"]
    lines = [
        "<!-- Generated by docs/gen-api.py from crds/dbop.dev.yaml: do not edit. -->",
        "# API reference",
        "",
        "> Generated from `crds/dbop.dev.yaml` (itself generated from `src/api/`). Do not edit by "
        "hand; regenerate with `python3 docs/gen-api.py > docs/api.md`.",
        "",
        "dbop serves these kinds:",
        "",
    ]
    for crd in crds:
        n = crd["spec"]["names"]
        anchor = n["kind"].lower()
        short = ", ".join(n.get("shortNames", []))
        lines.append(f"- [`{n['kind']}`](#{anchor}) (`{n['plural']}`, short name `{short}`)")
    lines += [
        "",
        "Field paths use `[]` for the items of a list and `{}` for the values of a map. "
        "CEL rules marked *on update* compare the new object with the old one (`oldSelf`), "
        "so they only apply to changes. The API server also prunes unknown fields.",
        "",
    ]
    for crd in crds:
        lines += render_kind(crd)
    sys.stdout.write("\n".join(lines).rstrip("\n") + "\n")


if __name__ == "__main__":
    main()
