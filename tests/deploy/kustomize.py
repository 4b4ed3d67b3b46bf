"""A small kustomize, enough for deploy/k8s, so the manifests are rendered and checked offline.

Covers what the base and the overlays use: ``resources`` (files and kustomization folders),
``components`` (folders of ``kind: Component``: their resources join the including
kustomization's, and their own fields apply to everything accumulated so far, before the
including kustomization's), ``namespace``, ``labels`` (``pairs`` on metadata only), ``images``
(``newName``/``newTag``/``digest``) and ``patches`` given as strategic-merge files (maps merge,
lists of named items merge by ``name``, other lists are replaced, ``null`` deletes). Anything
else in a kustomization.yaml is refused, so the renderer cannot silently drift from what
kustomize does; tests/deploy/test_manifests.py also compares it with ``kubectl kustomize`` where
that exists.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {
    "apiVersion",
    "kind",
    "resources",
    "components",
    "namespace",
    "labels",
    "images",
    "patches",
}
#: ``kind`` of a kustomization that only renders inside another one (``components:``).
COMPONENT = "Component"
#: Kinds that have no namespace.
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}

Resource = dict[str, Any]


def load_all(path: Path) -> list[Resource]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kustomization_of(folder: Path) -> dict[str, Any]:
    kustomization: dict[str, Any] = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED
    if unknown:
        raise ValueError(f"{folder}/kustomization.yaml uses {sorted(unknown)}: not covered here")
    return kustomization


def render(folder: Path) -> list[Resource]:
    """The resources ``kubectl kustomize folder`` would print (in no particular order)."""
    kustomization = kustomization_of(folder)
    if kustomization.get("kind") == COMPONENT:
        raise ValueError(f"{folder} is a component: it renders only inside a kustomization")
    resources = _accumulate(folder, kustomization)
    for entry in kustomization.get("components", []):
        component = kustomization_of(folder / entry)
        if component.get("kind") != COMPONENT:
            raise ValueError(f"{folder / entry} is listed as a component but is not one")
        if "components" in component:
            raise ValueError(f"{folder / entry}: components of a component are not covered here")
        resources += _accumulate(folder / entry, component)
        _transform(resources, component, folder / entry)
    _transform(resources, kustomization, folder)
    return resources


def _accumulate(folder: Path, kustomization: dict[str, Any]) -> list[Resource]:
    resources: list[Resource] = []
    for entry in kustomization.get("resources", []):
        path = folder / entry
        resources += render(path) if path.is_dir() else load_all(path)
    return resources


def _transform(resources: list[Resource], kustomization: dict[str, Any], folder: Path) -> None:
    """Apply a kustomization's patches, labels, namespace and images to ``resources``."""
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
