"""A small kustomize, enough for deploy/k8s, so the manifests are rendered and checked offline.

Covers what the base and the overlays use: ``resources`` (files and kustomization folders),
``namespace``, ``labels`` (``pairs`` on metadata only), ``images`` (``newName``/``newTag``/
``digest``) and ``patches`` given as strategic-merge files (maps merge, lists of named items
merge by ``name``, other lists are replaced, ``null`` deletes). Anything else in a
kustomization.yaml is refused, so the renderer cannot silently drift from what kustomize does;
tests/deploy/test_manifests.py also compares it with ``kubectl kustomize`` where that exists.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "labels", "images", "patches"}
#: Kinds that have no namespace.
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}

Resource = dict[str, Any]


def load_all(path: Path) -> list[Resource]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def render(folder: Path) -> list[Resource]:
    """The resources ``kubectl kustomize folder`` would print (in no particular order)."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED
    if unknown:
        raise ValueError(f"{folder}/kustomization.yaml uses {sorted(unknown)}: not covered here")
    resources: list[Resource] = []
    for entry in kustomization.get("resources", []):
        path = folder / entry
        resources += render(path) if path.is_dir() else load_all(path)
    for patch in kustomization.get("patches", []):
        _patch(resources, load_all(folder / patch["path"]), folder)
    for label in kustomization.get("labels", []):
        if label.get("includeSelectors") or label.get("includeTemplates"):
            raise ValueError("labels with includeSelectors/includeTemplates are not covered here")
        for resource in resources:
            resource.setdefault("metadata", {}).setdefault("labels", {}).update(label["pairs"])
    if "namespace" in kustomization:
        for resource in resources:
            if resource["kind"] not in CLUSTER_SCOPED:
                resource["metadata"]["namespace"] = kustomization["namespace"]
    for image in kustomization.get("images", []):
        for resource in resources:
            _set_images(resource, image)
    return resources


def _patch(resources: list[Resource], patches: list[Resource], folder: Path) -> None:
    for patch in patches:
        key = (patch["kind"], patch["metadata"]["name"])
        targets = [r for r in resources if (r["kind"], r["metadata"]["name"]) == key]
        if len(targets) != 1:
            raise ValueError(f"patch in {folder} for {key} matches {len(targets)} resources")
        merged = merge(targets[0], patch)
        targets[0].clear()
        targets[0].update(merged)


def merge(base: Any, patch: Any) -> Any:
    """Strategic merge of ``patch`` into ``base`` (a copy)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = merge(out[key], value)
            else:
                out[key] = copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and _named(base) and _named(patch):
        out = copy.deepcopy(base)
        for item in patch:
            same = [i for i, old in enumerate(out) if old["name"] == item["name"]]
            if same:
                out[same[0]] = merge(out[same[0]], item)
            else:
                out.append(copy.deepcopy(item))
        return out
    return copy.deepcopy(patch)


def _named(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(i, dict) and "name" in i for i in items)


def containers(resource: Resource) -> list[dict[str, Any]]:
    """Every container and init container of a workload (Deployment, Job, CronJob, ...)."""
    spec = resource.get("spec", {})
    if resource["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    pod = spec.get("template", {}).get("spec", {})
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


def _set_images(resource: Resource, image: dict[str, str]) -> None:
    for container in containers(resource):
        name, _, _ = container["image"].partition("@")
        repository = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
        if repository != image["name"]:
            continue
        new = image.get("newName", repository)
        if "digest" in image:
            container["image"] = f"{new}@{image['digest']}"
        else:
            tag = image.get("newTag") or (name.rsplit(":", 1)[1] if name != repository else None)
            container["image"] = f"{new}:{tag}" if tag else new
