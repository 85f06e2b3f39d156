"""The latent cache with real ComfyUI VAE and CLIP objects built in-process from tiny random files.

The pack is imported as the package ComfyUI makes of it (tests/pack.py), so
the node modules' relative imports (`..engine`) run exactly as inside ComfyUI.
"""
from __future__ import annotations

import logging
import os
import types

import pytest
import torch

from pack import load_pack  # tests/pack.py: the repo as the package ComfyUI makes of it

load_pack()
import PipeTrain.engine.cache.format as fmt_module  # noqa: E402
import PipeTrain.engine.cache.legacy as legacy_module  # noqa: E402
import PipeTrain.engine.cache.reader as reader_module  # noqa: E402
from PipeTrain.engine.cache.writer import write_item  # noqa: E402
import PipeTrain.engine.cache.shards as store_module  # noqa: E402
import PipeTrain.engine.cache.writer as writer_module  # noqa: E402
import PipeTrain.engine.data.scan as data_module  # noqa: E402
from PipeTrain.engine.data.images import load_image  # noqa: E402
import PipeTrain.nodes.cache_latents as cache_module  # noqa: E402
import PipeTrain.engine.cache.encoders as ident_module  # noqa: E402
import PipeTrain.nodes.load_dataset as load_module  # noqa: E402
from PipeTrain.engine.launch.comfy_bootstrap import import_comfy  # noqa: E402



@pytest.fixture(scope="module")
def comfy(comfy_root):
    import_comfy(comfy_root)
    import comfy.model_management
    import comfy.sd
    import comfy.utils

    return comfy


@pytest.fixture(scope="module")
def m():
    """The pack's modules, as ComfyUI would import them."""
    return types.SimpleNamespace(cache=cache_module, load=load_module, fmt=fmt_module, reader=reader_module, writer=writer_module, legacy=legacy_module, data=data_module,
                                 ident=ident_module)


@pytest.fixture(scope="module")
def encoders(comfy, tmp_path_factory):
    from tools.tiny_assets import load_tiny_encoders, write_tiny_clip, write_tiny_vae

    d = tmp_path_factory.mktemp("models")
    write_tiny_vae(str(d / "vae.safetensors"), seed=0)
    write_tiny_clip(str(d / "clip.safetensors"), seed=0)
    return load_tiny_encoders(str(d / "vae.safetensors"), str(d / "clip.safetensors"))


class Counting:
    """Delegates to a real ComfyUI VAE/CLIP and counts encode calls.

    `on_encode(n)` runs after the n-th VAE encode (1-based) if given.
    """

    def __init__(self, inner, on_encode=None):
        self._inner, self._on_encode = inner, on_encode
        self.vae_calls = self.clip_calls = 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def encode(self, pixels):
        self.vae_calls += 1
        out = self._inner.encode(pixels)
        if self._on_encode:
            self._on_encode(self.vae_calls)
        return out

    def encode_from_tokens_scheduled(self, tokens, **kw):
        self.clip_calls += 1
        return self._inner.encode_from_tokens_scheduled(tokens, **kw)


@pytest.fixture
def dataset(m, tmp_path):
    from tools.tiny_assets import write_tiny_dataset

    folder = tmp_path / "set"
    paths = write_tiny_dataset(str(folder), n=4, size=64, seed=1)
    # two images share a caption: the text encoder should run once for both
    (folder / "image_003.txt").write_text((folder / "image_002.txt").read_text())
    (spec,) = m.load.PipeTrainLoadDataset().load(folders=str(folder), resolution=64, repeats=2)
    return spec, paths


def _run(m, spec, vae, clip, regenerate=False):
    (cache_spec,) = m.cache.PipeTrainCacheLatents().cache(dataset=spec, vae=vae, clip=clip, regenerate=regenerate)
    return cache_spec


def test_cache_written_and_read_back(m, encoders, dataset, comfy):
    spec, paths = dataset
    vae, clip = Counting(encoders[0]), Counting(encoders[1])
    cs = _run(m, spec, vae, clip)
    assert (vae.vae_calls, clip.clip_calls) == (4, 3)  # 4 images, 3 distinct captions
    assert cs.count == 4 and cs.latent_shape == (4, 8, 8)
    assert m.fmt.CacheSpec.from_dict(cs.to_dict()) == cs
    ds = m.reader.CachedDataset(cs.cache_dir)
    assert len(ds) == 4 and ds.fingerprint == cs.fingerprint and all(ds.repeats(i) == 2 for i in range(4))

    # the stored tensors are exactly what ComfyUI's encoders return (batch dim removed)
    for i, path in enumerate(paths):
        item = ds[i]
        caption = open(os.path.splitext(path)[0] + ".txt", encoding="utf-8").read().strip()
        assert item["caption"] == caption and item["source"] == os.path.basename(path)
        pixels = torch.from_numpy(load_image(path, 64)).unsqueeze(0)
        torch.testing.assert_close(item["latent"], encoders[0].encode(pixels)[0])
        cond, extras = encoders[1].encode_from_tokens_scheduled(encoders[1].tokenize(caption))[0]
        torch.testing.assert_close(item["cross_attn"], cond[0])
        assert set(item["extras"]) == set(extras)
        for key, value in extras.items():
            if value is None:  # e.g. pooled_output=None: the key must survive for extra_conds
                assert key in item["extras"] and item["extras"][key] is None
            elif isinstance(value, torch.Tensor):
                torch.testing.assert_close(item["extras"][key], value[0])
    manifest = ds.manifest
    assert manifest["count"] == 4 and "cross_attn" in manifest["cond_keys"] and "pooled_output" in manifest["cond_keys"]
    assert set(manifest["encoders"]) == {"vae", "clip"}


def test_second_run_reuses_and_regenerate_rebuilds(m, encoders, dataset):
    spec, _ = dataset
    first = _run(m, spec, Counting(encoders[0]), Counting(encoders[1]))
    vae, clip = Counting(encoders[0]), Counting(encoders[1])
    assert _run(m, spec, vae, clip) == first
    assert (vae.vae_calls, clip.clip_calls) == (0, 0)

    marker = os.path.join(first.cache_dir, "stale-marker")
    open(marker, "w").close()
    sibling = os.path.join(os.path.dirname(first.cache_dir), "0123456789abcdef")
    os.makedirs(sibling)
    vae, clip = Counting(encoders[0]), Counting(encoders[1])
    assert _run(m, spec, vae, clip, regenerate=True) == first
    assert (vae.vae_calls, clip.clip_calls) == (4, 3)
    assert not os.path.exists(marker) and os.path.isdir(sibling)  # only this fingerprint's folder


def test_trust_cache_skips_the_file_check(m, encoders, dataset):
    spec, paths = dataset
    vae, clip = Counting(encoders[0]), Counting(encoders[1])
    # no cache yet: trust_cache falls back to the normal, checked path
    (first,) = m.cache.PipeTrainCacheLatents().cache(dataset=spec, vae=vae, clip=clip, regenerate=False,
                                                    trust_cache=True)
    assert vae.vae_calls == 4
    from PIL import Image

    Image.new("RGB", (64, 64), (1, 2, 3)).save(paths[0])  # an edited image: a new fingerprint when checked
    os.utime(paths[0], ns=(1, 1))
    vae, clip = Counting(encoders[0]), Counting(encoders[1])
    (trusted,) = m.cache.PipeTrainCacheLatents().cache(dataset=spec, vae=vae, clip=clip, regenerate=False,
                                                      trust_cache=True)
    assert trusted == first and (vae.vae_calls, clip.clip_calls) == (0, 0)  # reused as-is, nothing opened
    (checked,) = m.cache.PipeTrainCacheLatents().cache(dataset=spec, vae=vae, clip=clip, regenerate=False)
    # a new fingerprint; only the edited image is encoded, the other 3 are copied from the first cache
    assert checked.fingerprint != first.fingerprint and vae.vae_calls == 1
    # other encoder settings never match a trusted cache
    other = m.writer.find_trusted_cache(spec, {"vae": "another", "clip": "x"})
    assert other is None


def test_only_changed_files_are_encoded_again(m, encoders, dataset, caplog):
    """An edited image or caption gives a new fingerprint (a new folder); the items of unchanged files
    are copied from the previous cache, with the same tensors, instead of encoded again."""
    spec, paths = dataset
    first = _run(m, spec, encoders[0], encoders[1])
    from PIL import Image

    Image.new("RGB", (64, 64), (200, 10, 10)).save(paths[1])
    with open(os.path.splitext(paths[0])[0] + ".txt", "a", encoding="utf-8") as f:
        f.write(" at night")
    vae, clip = Counting(encoders[0]), Counting(encoders[1])
    with caplog.at_level(logging.INFO, logger="PipeTrain"):
        second = _run(m, spec, vae, clip)
    assert second.fingerprint != first.fingerprint and vae.vae_calls == 2
    assert "0 item(s) reused, 2 copied from the previous cache, 2 encoded" in caplog.text
    old, new = m.reader.CachedDataset(first.cache_dir), m.reader.CachedDataset(second.cache_dir)
    assert new[0]["caption"].endswith(" at night")
    pixels = torch.from_numpy(load_image(paths[1], 64)).unsqueeze(0)
    torch.testing.assert_close(new[1]["latent"], encoders[0].encode(pixels)[0])
    for i in (2, 3):  # copied from the first cache's shard, not encoded (vae_calls above)
        for key in ("latent", "cross_attn"):
            assert torch.equal(new[i][key], old[i][key])
    assert new.table[2]["shard"] in {p.name for p in (new.cache_dir / "shards").iterdir()}
    vae = Counting(encoders[0])
    _run(m, spec, vae, encoders[1], regenerate=True)
    assert vae.vae_calls == 4  # regenerate copies nothing


def test_cancelled_run_resumes(m, encoders, dataset, comfy):
    spec, _ = dataset

    def cancel_after_two(n):
        # What the UI's Cancel button does: set ComfyUI's interrupt flag while the node works.
        # The node's per-item check then raises InterruptProcessingException, as in a real Cancel.
        if n == 2:
            comfy.model_management.interrupt_current_processing(True)

    with pytest.raises(comfy.model_management.InterruptProcessingException):
        _run(m, spec, Counting(encoders[0], on_encode=cancel_after_two), encoders[1])
    # the node's folder: plan_cache's fingerprint (file digests included: engine/cache/digests.py)
    fp_dir = m.writer.plan_cache(spec, m.ident.encoder_identity(*encoders), lambda _: None).cache_dir
    stored = store_module.scan_shards(fp_dir)
    done = [i in stored for i in range(4)]
    # Item 2 may or may not be stored: ComfyUI itself checks the flag while loading the text
    # encoder for item 2's caption. Either way the items encoded before Cancel were written as a
    # shard (not lost with the unfinished one), and they are a prefix.
    assert done in ([True, False, False, False], [True, True, False, False])
    with pytest.raises(m.fmt.CacheError, match="run CacheLatents again"):
        m.reader.CachedDataset(fp_dir)  # no manifest yet: incomplete

    vae, clip = Counting(encoders[0]), Counting(encoders[1])
    cs = _run(m, spec, vae, clip)
    assert vae.vae_calls == 4 - sum(done) and cs.count == 4 and len(m.reader.CachedDataset(cs.cache_dir)) == 4


def test_fingerprint_follows_files_and_encoders(m, encoders, dataset):
    spec, paths = dataset
    ident = m.ident.encoder_identity(*encoders)
    assert ident == m.ident.encoder_identity(*encoders)  # stable
    fp = lambda ident=ident: m.fmt.fingerprint(spec, m.data.scan_dataset(spec).items, ident)  # noqa: E731
    base = fp()
    st = os.stat(paths[0])
    os.utime(paths[0], ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    touched = fp()
    assert touched != base
    caption = os.path.splitext(paths[1])[0] + ".txt"
    with open(caption, "a", encoding="utf-8") as f:
        f.write(" with more words")
    assert fp() not in (base, touched)
    other_clip = {**ident, "clip": {**ident["clip"], "layer_idx": -2}}
    assert fp(other_clip) != fp()
    # repeats change how often an item is seen, not its latent: same fingerprint
    more = m.data.DatasetSpec(tuple(m.data.FolderSpec(f.path, 5) for f in spec.folders), spec.resolution)
    assert m.fmt.fingerprint(more, m.data.scan_dataset(more).items, ident) == fp()


def test_identity_ignores_loaded_lora_patching(m, encoders):
    """Patched weights are sampled from ComfyUI's backup, so the identity doesn't flip on load."""
    clip = encoders[1].clone()
    sd = clip.cond_stage_model.state_dict()
    key = next(k for k in m.ident._spread(sorted(sd), m.ident.SAMPLED_TENSORS) if sd[k].ndim == 2)  # a sampled weight
    plain = m.ident.clip_identity(clip)
    clip.add_patches({key: (torch.ones_like(clip.cond_stage_model.state_dict()[key]),)}, 0.5)
    patched = m.ident.clip_identity(clip)
    assert patched["patches_sha256"] and patched != plain
    before = clip.cond_stage_model.state_dict()[key].clone()
    clip.load_model()  # ComfyUI writes the patched weights into the module now
    try:
        assert not torch.equal(clip.cond_stage_model.state_dict()[key], before)  # really patched in place
        assert m.ident.clip_identity(clip) == patched
    finally:
        clip.patcher.unpatch_model()  # the module is shared with the other tests' CLIP
    assert torch.equal(clip.cond_stage_model.state_dict()[key], before)


def test_format_keeps_none_and_json_extras(m, tmp_path):
    cache_dir = tmp_path / ".pipetrain_cache" / "00000000000000aa"
    mask = torch.ones(1, 7, dtype=torch.int64)
    skipped = write_item(cache_dir, 0, torch.randn(1, 4, 8, 8), torch.randn(1, 7, 16),
                         {"pooled_output": None, "attention_mask": mask, "guidance": 3.5, "obj": object()},
                         "a.png", "a caption", 3)
    assert skipped == ["obj"]
    assert m.legacy.item_summary(cache_dir, 0) == ((4, 8, 8), ["attention_mask", "cross_attn", "guidance", "pooled_output"])
    spec = m.data.DatasetSpec((m.data.FolderSpec(str(tmp_path)),), 64)
    m.legacy.write_manifest(cache_dir, "00000000000000aa", spec, [{"file": "items/000000.safetensors", "source": "a.png",
                                                                   "repeats": 3}], (4, 8, 8), ["cross_attn"], {})
    item = m.reader.CachedDataset(cache_dir)[0]
    assert item["extras"]["pooled_output"] is None and "pooled_output" in item["extras"]
    assert item["extras"]["guidance"] == 3.5 and item["extras"]["attention_mask"].shape == (7,)
    assert item["caption"] == "a caption" and item["cross_attn"].shape == (7, 16)
    assert not list(cache_dir.glob("items/.*tmp*"))  # no temp files left behind
    with pytest.raises(m.fmt.CacheError, match="refusing to delete"):
        m.fmt.remove_cache(tmp_path)


def test_load_dataset_node_relative_to_input_and_is_changed(m, comfy, tmp_path, monkeypatch):
    import folder_paths

    (tmp_path / "cats").mkdir()
    from PIL import Image

    Image.new("RGB", (64, 64)).save(tmp_path / "cats" / "a.png")
    monkeypatch.setattr(folder_paths, "get_input_directory", lambda: str(tmp_path))
    node = m.load.PipeTrainLoadDataset
    (spec,) = node().load(folders="cats | repeats=4", resolution=64, repeats=1)
    assert spec.folders == (m.data.FolderSpec(str(tmp_path / "cats"), 4),)
    sig = node.IS_CHANGED(folders="cats", resolution=64, repeats=1)
    assert sig == node.IS_CHANGED(folders="cats", resolution=64, repeats=1)
    (tmp_path / "cats" / "a.txt").write_text("a cat")
    assert node.IS_CHANGED(folders="cats", resolution=64, repeats=1) != sig
    bad = node.IS_CHANGED(folders="dogs", resolution=64, repeats=1)
    assert bad != bad  # NaN: ComfyUI runs the node, which then reports the error
    with pytest.raises(m.data.DatasetError, match="input folder"):
        node().load(folders="dogs", resolution=64, repeats=1)
    inputs = node.INPUT_TYPES()["required"]
    assert all("tooltip" in opts for _, opts in inputs.values())
    assert all("tooltip" in v[1] for v in m.cache.PipeTrainCacheLatents.INPUT_TYPES()["required"].values())
