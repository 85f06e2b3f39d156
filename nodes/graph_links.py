"""Reading the queued graph (ComfyUI's API prompt, a node's hidden PROMPT input): which node feeds an input,
and which model file a loader node names. The nodes that need files for processes of their own
(nodes/cache_sources.py, nodes/model_sources.py) follow links with these and word their own refusals."""
from __future__ import annotations

from . import compat


def linked(prompt: dict, node_id, input_name: str) -> tuple[str, dict, int] | None:
    """(id, node, output index) of the node linked to `input_name` of node `node_id`; None when unlinked."""
    link = ((prompt.get(str(node_id)) or {}).get("inputs") or {}).get(input_name)
    if not (isinstance(link, list) and len(link) == 2 and str(link[0]) in prompt):
        return None
    return str(link[0]), prompt[str(link[0])], int(link[1])


def named_file(node: dict, input_name: str, folder: str) -> tuple[object, str | None]:
    """(the value, its path in ComfyUI's models/`folder`) of a loader's file input; the path is None when the
    value is not a file there (or is wired from another node)."""
    name = (node.get("inputs") or {}).get(input_name)
    return name, compat.full_path(folder, name) if isinstance(name, str) else None
