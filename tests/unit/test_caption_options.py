"""LoadDataset's caption options without encoders: the texts each caption becomes (prefix, tag shuffles with
keep_tokens, one caption per line), the values refused, what the cache fingerprint keeps, and the picks
training makes among the cached encodings (engine/train/caption_picks.py). The encoding with a real CLIP
is tests/with_comfy/test_cache_captions.py."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from pack import load_pack

load_pack()
from PipeTrain.engine.cache.format import fingerprint, item_key, shapes_bucket  # noqa: E402
from PipeTrain.engine.data.caption_variants import caption_texts, split_tags  # noqa: E402
from PipeTrain.engine.data.messages import DatasetError  # noqa: E402
from PipeTrain.engine.data.scan import DatasetItem, DatasetSpec, FolderSpec  # noqa: E402
from PipeTrain.engine.train.caption_picks import dropped, encoding_index, pick_items  # noqa: E402
from PipeTrain.engine.train.sample_order import SampleStream  # noqa: E402
from headless_config import cache_config_error

pytestmark = pytest.mark.core  # also on ComfyUI 0.33
SPEC = DatasetSpec(folders=(FolderSpec("/data/set"),), resolution=512)
ITEMS = [DatasetItem("/data/set/a.png", "a cat, red", 1, 100, 5, 64, 64),
         DatasetItem("/data/set/b.png", None, 2, 200, 6, 64, 48)]
IDENTITY = {"vae": "x", "clip": "y"}


def test_prefix_comes_first_in_every_text_and_alone_for_an_empty_caption():
    assert caption_texts("a cat", "ohwx, ") == [["ohwx, a cat"]]
    assert caption_texts(None, "ohwx, ") == [["ohwx"]] and caption_texts("", "ohwx ") == [["ohwx"]]
    for text in caption_texts("a, b, c, d, e", "ohwx, ", shuffles=6)[0]:
        assert text.startswith("ohwx, ")


def test_shuffles_keep_the_first_tags_in_place_and_are_the_same_every_time():
    caption = "alice, red hair, smile, outdoors, blue sky, tree"
    orders = caption_texts(caption, shuffles=8, keep_tokens=1)[0]
    assert len(orders) == 8 and len(set(orders)) == 8
    assert all(split_tags(o)[0] == "alice" and sorted(split_tags(o)) == sorted(split_tags(caption)) for o in orders)
    assert caption_texts(caption, shuffles=8, keep_tokens=1)[0] == orders  # seeded by the text: a re-run agrees
    two = caption_texts(caption, shuffles=8, keep_tokens=2)[0]
    assert all(split_tags(o)[:2] == ["alice", "red hair"] for o in two)
    assert caption_texts("x, y", shuffles=8)[0] in (["x, y", "y, x"], ["y, x", "x, y"])  # distinct orders only


def test_caption_lines_give_one_caption_per_non_empty_line():
    assert caption_texts("one\n\n two \nthree", "p ", lines=True) == [["p one"], ["p two"], ["p three"]]
    assert caption_texts("one\ntwo") == [["one\ntwo"]]  # off: the file is one caption, as before
    lines = caption_texts("a, b, c\nd, e, f", lines=True, shuffles=3, keep_tokens=1)
    assert len(lines) == 2 and all(o.startswith("a, ") for o in lines[0]) and all(o.startswith("d, ") for o in lines[1])


@pytest.mark.parametrize("change, fix", [
    ({"tag_shuffles": 1}, "use 0 (tags keep their order) or 2 to 32"),
    ({"tag_shuffles": 33}, "use 0"),
    ({"keep_tokens": 2}, "set tag_shuffles"),
    ({"keep_tokens": -1, "tag_shuffles": 4}, "use a whole number from 0"),
    ({"caption_dropout": 1.0}, "below 1"),
    ({"caption_dropout": -0.1}, "from 0 (off)"),
    ({"caption_prefix": "ohwx,\n"}, "on one line"),
])
def test_bad_values_are_refused_with_the_fix(change, fix):
    spec = dataclasses.replace(SPEC, **change)
    with pytest.raises(DatasetError, match=fix.replace("(", r"\(").replace(")", r"\)")):
        spec.check()


def test_defaults_keep_the_fingerprint_and_spec_of_caches_made_before_the_options():
    # golden values of the code before caption options existed: no existing cache is encoded again
    assert fingerprint(SPEC, ITEMS, IDENTITY) == "4f98ea9aeec3fb7d"
    assert item_key(SPEC, ITEMS[0], (512, 512)) == "b9e736836b35294f3d3eb50ccc7be2bc"
    bucketed = dataclasses.replace(SPEC, aspect_ratios=(1.0, 1.5))
    assert fingerprint(bucketed, ITEMS, IDENTITY, {"/data/set/a.png": "d1"}) == "ccbd69633c57b880"
    assert item_key(bucketed, ITEMS[1], (512, 384), "d2") == "d2af51e4cca3708be1f21b492889d1d9"
    assert set(SPEC.to_dict()) == {"folders", "resolution", "caption_ext", "version", "aspect_ratios",
                                   "extra_resolutions", "bucket_multiple", "video_frames", "frame_stride"}


def test_what_changes_the_encoded_text_changes_the_fingerprint_and_dropout_does_not():
    base = fingerprint(SPEC, ITEMS, IDENTITY)
    for change in ({"caption_prefix": "ohwx, "}, {"caption_lines": True}, {"tag_shuffles": 4},
                   {"tag_shuffles": 4, "keep_tokens": 1}):
        spec = dataclasses.replace(SPEC, **change)
        assert fingerprint(spec, ITEMS, IDENTITY) != base, change
        assert item_key(spec, ITEMS[0], (512, 512)) != item_key(SPEC, ITEMS[0], (512, 512)), change
    dropout = dataclasses.replace(SPEC, caption_dropout=0.3)
    assert fingerprint(dropout, ITEMS, IDENTITY) == base
    assert DatasetSpec.from_dict(dropout.to_dict()) == dropout  # the manifest carries it to training


def test_variants_shaped_like_the_main_encoding_do_not_split_buckets():
    plain = {"latent": [4, 8, 8], "cond.cross_attn": [77, 768]}
    assert shapes_bucket({**plain, "caption.1.cross_attn": [77, 768]}) == shapes_bucket(plain)
    assert shapes_bucket({**plain, "caption.1.cross_attn": [154, 768]}) != shapes_bucket(plain)


def test_dropout_picks_the_seeded_share_of_samples():
    picks = [dropped(7, 0.25, p) for p in range(4000)]
    assert 0.23 < sum(picks) / len(picks) < 0.27
    assert picks == [dropped(7, 0.25, p) for p in range(4000)]  # a pure function of (seed, position): resume
    assert picks != [dropped(8, 0.25, p) for p in range(4000)]
    assert not any(dropped(7, 0.0, p) for p in range(100))


def test_lines_cycle_over_epochs_and_orders_vary_per_step():
    lines = [1, 1, 1]  # three caption lines, no shuffle
    for item in range(5):
        assert sorted(encoding_index(lines, 3, epoch, item, 0) for epoch in range(3)) == [0, 1, 2]
    shuffled = [4, 4]  # two lines of four orders: line per epoch, order per position
    seen = {encoding_index(shuffled, 3, 0, 0, p) for p in range(40)}
    assert len(seen) == 4 and (seen <= {0, 1, 2, 3} or seen <= {4, 5, 6, 7})
    assert encoding_index([1], 3, 5, 2, 9) == 0


class FakeCache:
    """CachedDataset's caption interface on tensors: item i's encoding k is [[i, k]]; the empty caption [[-1, -1]]."""

    caption_dropout = 0.25

    def __init__(self, lines):
        self.lines = lines

    def __len__(self):
        return len(self.lines)

    def __getitem__(self, i):
        return self.with_caption(i, 0)

    def caption_lines(self, i):
        return self.lines[i]

    def with_caption(self, i, k):
        return {"latent": torch.zeros(4, 2, 2), "cross_attn": torch.tensor([[float(i), float(k)]]), "extras": {}}

    def with_empty_caption(self, item):
        return {**item, "cross_attn": torch.tensor([[-1.0, -1.0]])}

    def dropout_of(self, i):
        return self.caption_dropout

    def without_caption(self, i, item):
        return self.with_empty_caption(item)


def _picked(dataset, stream, positions):
    return [tuple(it["cross_attn"][0].tolist()) for it in pick_items(dataset, stream, positions)]


def test_picks_are_the_same_on_every_rank_split_and_on_resume():
    dataset = FakeCache([[3], [1, 1, 1], [2, 2], [1]])
    stream = SampleStream([1, 2, 1, 1], seed=11)
    steps, world, gas, batch = 12, 2, 2, 1
    one = [_picked(dataset, stream, SampleStream.positions(s, m, 0, 1, gas * world, batch))
           for s in range(steps) for m in range(gas * world)]
    ranks = [_picked(dataset, SampleStream([1, 2, 1, 1], seed=11), SampleStream.positions(s, m, r, world, gas, batch))
             for s in range(steps) for m in range(gas) for r in range(world)]
    assert one == ranks
    resumed = SampleStream([1, 2, 1, 1], seed=11)  # a fresh stream from step 6, as after a resume
    assert [_picked(dataset, resumed, SampleStream.positions(s, 0, 0, 1, 1, 1)) for s in range(6, 12)] == \
        [_picked(dataset, stream, SampleStream.positions(s, 0, 0, 1, 1, 1)) for s in range(6, 12)]


def test_collate_trains_the_dropped_share_with_the_empty_caption():
    from PipeTrain.engine.train.sample_order import collate

    dataset = FakeCache([[1]] * 8)
    stream = SampleStream([1] * 8, seed=5)
    samples = 400
    empty = sum(bool((c["cross_attn"] == -1).all()) for p in range(samples)
                for c in collate(dataset, stream, [p], torch.device("cpu"))[1])
    assert empty == sum(dropped(5, 0.25, p) for p in range(samples))  # exactly the seeded picks
    assert 0.2 * samples < empty < 0.3 * samples


def test_node_inputs_come_last_with_tooltips_and_bad_values_stop_the_node(tmp_path):
    import PipeTrain.nodes.load_dataset as load_node

    optional = load_node.PipeTrainLoadDataset.INPUT_TYPES()["optional"]
    names = list(optional)
    # saved workflows store widget values by position: the inputs before these keep their places
    assert names[-9:] == ["target_fps", "caption_prefix", "caption_lines", "tag_shuffles", "keep_tokens",
                          "caption_dropout", "frame_buckets", "clip_mode",  # the video clip inputs came later
                          "batch_sizes"]  # and batch sizes per resolution after them
    assert all(optional[n][1].get("tooltip") for n in names[-5:])
    assert optional["caption_dropout"][1]["default"] == 0.0 and optional["tag_shuffles"][1]["default"] == 0
    (tmp_path / "a.png").write_bytes(b"")  # never read: the settings are refused first
    with pytest.raises(DatasetError, match="keep_tokens is 1 but tag_shuffles is 0"):
        load_node.PipeTrainLoadDataset().load(folders=str(tmp_path), resolution=64, repeats=1, keep_tokens=1)
    from PipeTrain.engine.data.caption_variants import options_summary

    assert options_summary(SPEC) == ""
    assert options_summary(dataclasses.replace(SPEC, caption_prefix="ohwx, ", tag_shuffles=8, keep_tokens=1,
                                               caption_dropout=0.1)) == (
        "captions: prefix 'ohwx, '; 8 shuffled tag orders per caption, the first 1 tag(s) in place; 0.1 of the "
        "samples train with the empty caption.")
    changed = load_node.PipeTrainLoadDataset.IS_CHANGED(str(tmp_path), 64, 1, caption_dropout=1.0)
    assert changed != changed  # NaN: ComfyUI runs the node, which reports the error
    with pytest.raises(DatasetError, match="caption_dropout is 1.0"):
        load_node.PipeTrainLoadDataset().load_and_report(folders=str(tmp_path), resolution=64, repeats=1,
                                                         caption_dropout=1.0)


def test_headless_cache_config_takes_the_caption_keys_and_refuses_bad_values(tmp_path):
    error = cache_config_error(tmp_path)

    assert "dataset: tag_shuffles is 1" in error(tag_shuffles=1)
    assert "dataset: caption_dropout is 2" in error(caption_dropout=2)
    # good values pass the dataset checks; the next missing setting is the VAE
    assert "no VAE" in error(caption_prefix="ohwx, ", caption_lines=True, tag_shuffles=4, keep_tokens=1,
                             caption_dropout=0.1)


def test_collate_for_cfg_augment_gives_each_sample_its_empty_caption_beside_its_own():
    """CFG-augmented training (engine/train/cfg_augment.py): every cond carries the item on the empty caption
    under "uncond"; the trained caption is the one picked as without it."""
    from PipeTrain.engine.train.sample_order import collate

    dataset = FakeCache([[1]] * 6)
    plain = collate(dataset, SampleStream([1] * 6, seed=5), [0, 1, 2], torch.device("cpu"))[1]
    conds = collate(dataset, SampleStream([1] * 6, seed=5), [0, 1, 2], torch.device("cpu"), uncond=True)[1]
    for cond, same in zip(conds, plain):
        assert torch.equal(cond["cross_attn"], same["cross_attn"])
        assert (cond["uncond"]["cross_attn"] == -1).all() and "uncond" not in same
