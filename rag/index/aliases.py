"""Qdrant aliases: a name that only ever points at a complete collection, swapped in one request."""

from __future__ import annotations


def alias_target(client, alias: str) -> str | None:
    for a in client.get_aliases().aliases:
        if a.alias_name == alias:
            return a.collection_name
    return None


def point_alias_to(client, alias: str, collection: str) -> None:
    """Swap the alias in one request: readers see the old collection or the new one, never neither."""
    from qdrant_client import models

    ops = []
    if alias_target(client, alias) is not None:
        ops.append(models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=alias)))
    ops.append(
        models.CreateAliasOperation(create_alias=models.CreateAlias(collection_name=collection, alias_name=alias))
    )
    client.update_collection_aliases(change_aliases_operations=ops)


def aliased_collections(client) -> set[str]:
    """Every collection some alias points at: the (strategy, model) aliases and the serving aliases
    `<strategy>__production` alike. Each is complete and may be serving searches right now."""
    return {a.collection_name for a in client.get_aliases().aliases}
