"""`build(DIR)`: what `kustomize build DIR` gives, for the part of kustomize that deploy/kubernetes uses.

There is no kustomize binary here, so the tests render the overlays with this. Supported, with
kustomize's semantics:

- `resources`: files (every YAML document in them) and directories (their `kustomization.yaml`);
- `secretGenerator` with `envs` and `literals` (`type` Opaque unless given), under
  `generatorOptions.disableNameSuffixHash: true` (so no names need rewriting);
- `patches` with `path`: strategic merge patches, matched to their resource by apiVersion, kind and name.
  Maps merge key by key and a `null` value removes a key; the lists in `MERGE_KEYS` merge item by item on
  their key, an item with `$patch: delete` removes its match; every other list is replaced whole (Kubernetes'
  default for lists without a merge key); a document `$patch: delete` removes its resource;
- `images`: `newName`, `newTag` and `digest` for the containers and init containers of pod templates;
- `namespace`: set on every resource.

Anything else in a kustomization, a patch directive other than `$patch: delete`, or a patch of a list whose
merge key depends on where it is (`ports`) raises `Unsupported`, so a manifest can never rely on something
this renderer silently gets wrong.
"""
from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

KUSTOMIZATION = "kustomization.yaml"
FIELDS = {"apiVersion", "kind", "resources", "patches", "secretGenerator", "generatorOptions", "images", "namespace"}
MERGE_KEYS = {"containers": "name", "initContainers": "name", "volumes": "name", "env": "name",
              "volumeMounts": "mountPath"}
AMBIGUOUS_LISTS = {"ports"}  # containerPort in a container, port in a Service
POD_TEMPLATE_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "ReplicaSet"}


class Unsupported(ValueError):
    """The kustomization uses something this renderer does not implement."""


Resource = dict[str, Any]


def load_documents(path: Path) -> list[Resource]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def build(directory: Path) -> list[Resource]:
    """The resources `kustomize build directory` would print, in order."""
    directory = Path(directory)
    k = yaml.safe_load((directory / KUSTOMIZATION).read_text())
    unknown = set(k) - FIELDS
    if unknown:
        raise Unsupported(f"{directory / KUSTOMIZATION}: unsupported fields {sorted(unknown)}")
    if k.get("kind") != "Kustomization" or not str(k.get("apiVersion", "")).startswith("kustomize.config.k8s.io/"):
        raise Unsupported(f"{directory / KUSTOMIZATION}: not a Kustomization")
    resources: list[Resource] = []
    for entry in k.get("resources", []):
        path = directory / entry
        resources += build(path) if path.is_dir() else load_documents(path)
    resources += [generate_secret(g, directory, k.get("generatorOptions", {})) for g in k.get("secretGenerator", [])]
    for patch in k.get("patches", []):
        if set(patch) != {"path"}:
            raise Unsupported(f"patch {patch}: only `path` (a strategic merge patch file) is supported")
        for document in load_documents(directory / patch["path"]):
            resources = apply_patch(resources, document)
    for image in k.get("images", []):
        set_image(resources, image)
    if "namespace" in k:
        for r in resources:
            r["metadata"]["namespace"] = k["namespace"]
    names = [identity(r) for r in resources]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise ValueError(f"{directory}: resources defined twice: {sorted(duplicates)}")
    return resources


def identity(r: Resource) -> tuple[str, str, str]:
    group = r["apiVersion"].rpartition("/")[0]
    return group, r["kind"], r["metadata"]["name"]


def generate_secret(generator: dict[str, Any], directory: Path, options: dict[str, Any]) -> Resource:
    if set(options) - {"disableNameSuffixHash"} or not options.get("disableNameSuffixHash"):
        raise Unsupported("secretGenerator needs generatorOptions.disableNameSuffixHash: true (no name hashes here)")
    if set(generator) - {"name", "envs", "literals", "type"}:
        raise Unsupported(f"secretGenerator {generator.get('name')}: unsupported fields")
    pairs = list(generator.get("literals", []))
    for env_file in generator.get("envs", []):
        lines = (directory / env_file).read_text().splitlines()  # a missing file fails, as kustomize does
        pairs += [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    data = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"secretGenerator {generator['name']}: {pair!r} is not KEY=VALUE")
        data[key.strip()] = base64.b64encode(value.encode()).decode()
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": generator["name"]},
            "type": generator.get("type", "Opaque"), "data": data}


def apply_patch(resources: list[Resource], patch: Resource) -> list[Resource]:
    target = identity(patch)
    matches = [i for i, r in enumerate(resources) if identity(r) == target]
    if len(matches) != 1:
        raise ValueError(f"patch {target}: {len(matches)} matching resources")
    i = matches[0]
    if patch.get("$patch") == "delete":
        return resources[:i] + resources[i + 1:]
    out = list(resources)
    out[i] = merge(resources[i], patch, "")
    return out


def merge(base: Any, patch: Any, field: str) -> Any:
    """The strategic merge of `patch` into `base`; `field` is the key `base` sits under."""
    if isinstance(patch, dict):
        if "$patch" in patch:
            raise Unsupported(f"{field}: directive $patch: {patch['$patch']} is not supported here")
        if not isinstance(base, dict):
            return strip_nulls(patch)
        out = copy.deepcopy(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = merge(out[key], value, key)
            else:
                out[key] = merge(None, value, key)
        return out
    if isinstance(patch, list):
        if field in AMBIGUOUS_LISTS:
            raise Unsupported(f"patching `{field}` lists is not supported (its merge key depends on the resource)")
        key = MERGE_KEYS.get(field)
        if key is None or not isinstance(base, list):
            if any(isinstance(item, dict) and "$patch" in item for item in patch):
                raise Unsupported(f"{field}: $patch directives in a list without a merge key")
            return copy.deepcopy(patch)
        out = copy.deepcopy(base)
        for item in patch:
            found = [j for j, existing in enumerate(out) if existing.get(key) == item[key]]
            if item.get("$patch") == "delete":
                out = [existing for existing in out if existing.get(key) != item[key]]
            elif found:
                out[found[0]] = merge(out[found[0]], item, field)
            else:
                out.append(merge(None, item, field))
        return out
    return copy.deepcopy(patch)


def strip_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [strip_nulls(v) for v in value]
    return value


def pod_spec(r: Resource) -> dict[str, Any] | None:
    if r["kind"] not in POD_TEMPLATE_KINDS:
        return None
    return r["spec"]["template"]["spec"]


def set_image(resources: list[Resource], image: dict[str, Any]) -> None:
    if set(image) - {"name", "newName", "newTag", "digest"}:
        raise Unsupported(f"images: {image}")
    for r in resources:
        spec = pod_spec(r)
        for c in (spec or {}).get("containers", []) + (spec or {}).get("initContainers", []):
            name, tag = split_image(c["image"])
            if name != image["name"]:
                continue
            name = image.get("newName", name)
            if "digest" in image:
                c["image"] = f"{name}@{image['digest']}"
            else:
                tag = image.get("newTag", tag)
                c["image"] = f"{name}:{tag}" if tag else name


def split_image(ref: str) -> tuple[str, str | None]:
    """`registry/name:tag` -> (`registry/name`, `tag`); a digest is dropped with the tag."""
    ref = ref.split("@", 1)[0]
    head, _, last = ref.rpartition("/")
    if ":" in last:
        last, tag = last.split(":", 1)
        return (f"{head}/{last}" if head else last), tag
    return ref, None
