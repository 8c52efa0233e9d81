"""The mesh presets under the import path loadax 0.2 published them at; they live in
`loadax.delivery.meshes`."""

from loadax.delivery.meshes import ShardingPreset, ddp_sharding, fsdp_sharding

__all__ = ["ShardingPreset", "ddp_sharding", "fsdp_sharding"]
