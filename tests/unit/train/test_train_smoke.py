"""``facefuse train``: crops, captions, a 2-step smoke run, resume, refusals, atomic folders.

The smoke run trains on photos that ship inside installed packages, with the TAEF2 weights of
the shipped ``faces`` model, so it needs nothing from ../shared.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from facefuse.cli import main
from facefuse.core.errors import InvalidInput
from facefuse.core.samples import astronaut_png, grace_hopper_jpeg
from facefuse.models.loading import embedded_model, load_components
from facefuse.train import data

TAEF2 = embedded_model("faces") / "vae"
SMOKE = [
    *("--steps", "2", "--batch", "2", "--augmentations", "1", "--heldout", "0"),
    *("--checkpoint-every", "1", "--sample-steps", "2", "--no-progress", "--threads", "1"),
]


def _data_folder(root: Path) -> Path:
    """A folder shaped like ../shared/data: one London person and one portrait."""
    for kind, image in (("neutral", astronaut_png()), ("smiling", grace_hopper_jpeg())):
        (root / data.LONDON / kind).mkdir(parents=True)
        (root / data.LONDON / kind / "001.jpg").write_bytes(image)
    (root / data.PORTRAITS).mkdir()
    (root / data.PORTRAITS / "001.jpg").write_bytes(grace_hopper_jpeg())
    return root


def test_split_holds_out_a_seeded_disjoint_set():
    people = [f"{i:03d}" for i in range(82)]
    train, heldout = data.split_people(people, 16, seed=0)
    assert len(heldout) == 16 and not set(train) & set(heldout)
    assert data.split_people(people, 16, seed=0) == (train, heldout)
    with pytest.raises(InvalidInput, match="--heldout"):
        data.split_people(people, 82, seed=0)


def test_collect_photos_never_reads_heldout_people(tmp_path):
    root = _data_folder(tmp_path)
    kinds = sorted(p.kind for p in data.collect_photos(root, heldout=[], labels={}))
    assert kinds == ["neutral", "portrait", "smiling"]
    assert [p.kind for p in data.collect_photos(root, heldout=["001"])] == ["portrait"]
    with pytest.raises(InvalidInput, match=r"--data.*not a directory"):
        data.collect_photos(tmp_path / "missing", [])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidInput, match="no photos found"):
        data.collect_photos(tmp_path / "empty", [])


def test_crops_are_the_pipelines_crop_and_augmentation_moves_them(tmp_path):
    photo = data.Photo(tmp_path / "a.png", data.PORTRAITS, "a", "portrait")
    photo.path.write_bytes(astronaut_png())
    item = data.locate(photo, 128)
    plain = data.crop(item, 128)
    assert plain.shape == (128, 128, 3) and plain.dtype == np.float32
    from tests.unit.models.test_faces_model import _face_crop

    assert np.abs(plain - _face_crop(128)).mean() < 0.02  # same box, same resampling family
    augmented = data.crop(item, 128, np.random.default_rng(0))
    assert augmented.shape == plain.shape and np.abs(augmented - plain).mean() > 0.01


def test_unreadable_photo_names_the_file(tmp_path):
    bad = data.Photo(tmp_path / "bad.jpg", data.PORTRAITS, "bad", "portrait")
    bad.path.write_bytes(b"not an image")
    with pytest.raises(InvalidInput, match=r"bad\.jpg"):
        data.locate(bad, 128)


def test_captions_keep_their_kind_words():
    rng = np.random.default_rng(0)
    for _ in range(50):
        text = data.caption("smiling", rng)
        assert "smil" in text
        assert "smil" not in data.caption("neutral", rng)


def test_two_step_smoke_run_writes_a_model_that_loads_and_resumes(tmp_path, capsys):
    root = _data_folder(tmp_path / "data")
    run, out = tmp_path / "run", tmp_path / "model"
    args = ["train", "--data", str(root), "--taef2", str(TAEF2), "--run", str(run)]
    assert main([*args, "--out", str(out), *SMOKE]) == 0
    for name in ("checkpoint.pt", "latents.npz", "loss.png", "log.csv", "samples/step-000002.png"):
        assert (run / name).is_file(), name
    components = load_components(out)
    assert components.latent_channels == 32 and components.image_size == 128
    training = json.loads((out / "training.json").read_text())
    assert training["config"]["steps"] == 2 and training["photos"] == 3
    assert "CC BY 4.0" in (out / "README.md").read_text()
    # the served scheduler is told the run's target (v-prediction by default)
    assert components.scheduler_config["prediction_type"] == "v_prediction"
    # the same command again resumes at the end: no step is trained twice
    before = (run / "checkpoint.pt").stat().st_mtime_ns
    assert main([*args, *SMOKE]) == 0
    assert "resumed" in (run / "train.log").read_text()
    assert (run / "checkpoint.pt").stat().st_mtime_ns == before
    # another configuration is refused, naming the field
    assert main([*args, *SMOKE, "--lr", "0.001"]) == 2
    assert "lr: 0.0003 vs 0.001" in capsys.readouterr().err
    # so is a checkpoint trained under other caption labels (labels/*.csv edited since)
    import torch

    saved = torch.load(run / "checkpoint.pt", weights_only=True)
    assert saved["labels_digest"]
    torch.save({**saved, "labels_digest": "0123456789abcdef"}, run / "checkpoint.pt")
    assert main([*args, *SMOKE]) == 2
    assert "other caption labels (digest 0123456789abcdef" in capsys.readouterr().err


def test_interrupted_model_write_leaves_no_folder_that_loads(tmp_path, monkeypatch):
    from facefuse.train import folder as folder_module

    root = _data_folder(tmp_path / "data")
    out = tmp_path / "model"

    def fail(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(folder_module, "save_tokenizer_files", fail)
    args = ["train", "--data", str(root), "--taef2", str(TAEF2), "--run", str(tmp_path / "run")]
    assert main([*args, "--out", str(out), *SMOKE]) == 130
    assert not out.exists()


def test_a_folder_without_faces_is_refused(tmp_path, capsys):
    root = tmp_path / "data"
    (root / data.PORTRAITS).mkdir(parents=True)
    blank = np.full((64, 64, 3), 128, np.uint8)
    import cv2

    cv2.imwrite(str(root / data.PORTRAITS / "blank.png"), blank)
    args = ["train", "--data", str(root), "--taef2", str(TAEF2), "--run", str(tmp_path / "r")]
    assert main([*args, *SMOKE]) == 2
    assert "no usable face" in capsys.readouterr().err


def test_unknown_prediction_target_is_refused_naming_the_flag():
    from facefuse.train.config import TrainConfig

    with pytest.raises(InvalidInput, match="--prediction"):
        TrainConfig(prediction="sample")
    with pytest.raises(InvalidInput, match="--focus-timestep"):
        TrainConfig(focus_share=1.5)


def test_focused_timesteps_fall_below_the_focus_and_the_rest_cover_the_schedule():
    import torch

    from facefuse.train.config import TrainConfig
    from facefuse.train.loop import Trainer, noise_scheduler

    def draw(share: float) -> np.ndarray:
        trainer = Trainer.__new__(Trainer)  # only the timestep sampler's fields
        trainer.config = TrainConfig(focus_timestep=300, focus_share=share)
        trainer.noise = noise_scheduler(trainer.config)
        trainer.generator = torch.Generator().manual_seed(0)
        return trainer._timesteps(4000).numpy()

    assert draw(1.0).max() < 300
    spread = draw(0.5)
    assert 0.6 < (spread < 300).mean() < 0.7  # 0.5 + 0.5 * 0.3 expected
    assert spread.max() > 900


def test_the_training_template_is_the_served_one():
    """Captions are prefixed with the template the served prompt_optimizer puts before every
    prompt; the two must not drift apart (the prefix cache serves that template)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from facefuse.train.config import SERVED_TEMPLATE

    config = model_config_pb2.ModelConfig()
    root = Path(__file__).resolve().parents[3]
    text_format.Parse((root / "model_repository/prompt_optimizer/config.pbtxt").read_text(), config)
    assert config.parameters["prompt_template"].string_value == SERVED_TEMPLATE


def test_captions_are_comma_separated_and_generic_words_reach_every_set():
    rng = np.random.default_rng(0)
    texts = [data.caption("smiling", rng, generic_p=1.0, distractor_p=1.0) for _ in range(40)]
    for text in texts:
        parts = text.split(", ")
        assert len(parts) == 3 and any("smil" in p for p in parts)
        assert sum(p in data.GENERIC for p in parts[:2]) >= 1
    assert all(data.caption("neutral", rng, generic_p=0.0, distractor_p=0.0) in
               data.CAPTIONS["neutral"] for _ in range(20))  # fmt: skip


def test_labels_attach_to_their_photos_and_a_bad_value_names_the_file(tmp_path):
    root = _data_folder(tmp_path / "data")
    labels = {(data.LONDON, "001"): {"gender": "woman", "age": "old"},
              (data.PORTRAITS, "001"): {"gender": "woman", "expression": "smiling"}}  # fmt: skip
    photos = {(p.dataset, p.kind): p for p in data.collect_photos(root, [], labels)}
    assert photos[(data.LONDON, "smiling")].labels == "smiling|woman|old"
    assert photos[(data.PORTRAITS, "portrait")].labels == "smiling|woman|"
    folder = tmp_path / "labels"
    folder.mkdir()
    (folder / "people.csv").write_text("dataset,id,gender,age\nfaces,001,woman,unknown\n")
    assert data.read_labels(folder) == {("faces", "001"): {"gender": "woman", "age": ""}}
    (folder / "people.csv").write_text("dataset,id,gender,age\nfaces,001,girl,young\n")
    with pytest.raises(InvalidInput, match=r"people\.csv.*line 2: gender must be one of"):
        data.read_labels(folder)


def test_shipped_labels_cover_every_colour_portrait_and_london_person():
    labels = data.read_labels()
    assert sum(d == data.PORTRAITS and "gender" in v for (d, _), v in labels.items()) == 100
    assert sum(d == data.LONDON and "gender" in v for (d, _), v in labels.items()) == 82
    assert sum(v.get("expression") == "smiling" for v in labels.values()) > 500


def test_captions_say_the_person_and_a_known_expression_and_never_only_generic_words():
    rng = np.random.default_rng(0)
    texts = [data.caption("portrait", rng, generic_p=0.3, labels="smiling|woman|young")
             for _ in range(300)]  # fmt: skip
    assert all("woman" in t or "smil" in t or "smile" in t for t in texts)
    assert any("young woman" in t for t in texts) and any(
        "woman" in t and "young" not in t for t in texts
    )
    assert 0.55 < np.mean(["smil" in t or "smile" in t for t in texts]) < 0.85
    generic = np.mean([t.split(", ")[0] in data.GENERIC for t in texts])
    assert 0.2 < generic < 0.45  # the same rate as every other set, not 100%
    bw = [data.caption("bw", rng, distractor_p=0.0, labels="smiling||") for _ in range(50)]
    assert all(any(p in data.CAPTIONS["bw"] for p in t.split(", ")) for t in bw)
    assert not any("man" in t.split() for t in bw)  # no person word without a label
    # a photo with nothing known still gets a caption
    assert data.caption("portrait", rng, 0.0) in data.CAPTIONS["portrait"]


def test_grey_copies_have_no_colour():
    rng = np.random.default_rng(1)
    colour = rng.random((8, 8, 3), dtype=np.float32)
    grey = data.grey(colour)
    assert grey.shape == colour.shape and grey.dtype == np.float32
    assert np.allclose(grey[..., 0], grey[..., 1]) and np.allclose(grey[..., 1], grey[..., 2])
    assert np.allclose(grey[..., 0], colour @ np.array([0.299, 0.587, 0.114], np.float32))


@pytest.mark.parametrize("flag", ["--template-share", "--generic-share", "--grey-share"])
def test_caption_shares_out_of_range_are_refused(tmp_path, capsys, flag):
    root = _data_folder(tmp_path / "data")
    args = ["train", "--data", str(root), "--taef2", str(TAEF2), "--run", str(tmp_path / "r")]
    assert main([*args, *SMOKE, flag, "1.5"]) == 2
    assert f"{flag}: must be within 0..1, got 1.5" in capsys.readouterr().err


def test_warm_start_from_a_folder_of_another_shape_names_the_file(tmp_path, capsys):
    root = _data_folder(tmp_path / "data")
    args = ["train", "--data", str(root), "--taef2", str(TAEF2), "--run", str(tmp_path / "r")]
    faces = str(embedded_model("faces"))
    # the shipped model's text tower is 32 wide; a run of another width cannot start from it
    assert main([*args, *SMOKE, "--init-from", faces, "--text-hidden", "16"]) == 2
    assert re.search(
        r"--init-from: .*safetensors: weights of another shape", capsys.readouterr().err
    )
    assert main([*args, *SMOKE, "--init-from", str(tmp_path)]) == 2
    assert re.search(r"--init-from: .*unet.*missing", capsys.readouterr().err)


def test_warm_start_loads_the_shipped_weights_and_latent_space(tmp_path):
    from facefuse.train.config import TrainConfig
    from facefuse.train.loop import build_text_encoder, build_unet, warm_start

    folder = embedded_model("faces")
    config = TrainConfig(init_from=str(folder))
    unet, text = build_unet(config), build_text_encoder(config)
    before = next(iter(unet.parameters())).detach().clone()
    shift, scale = warm_start(config, unet, text)
    vae = json.loads((folder / "vae" / "config.json").read_text())
    assert (shift, scale) == (vae["shift_factor"], vae["scaling_factor"])
    assert not torch_equal(before, next(iter(unet.parameters())))


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_until_trains_a_part_of_the_run_and_writes_its_folder(tmp_path, capsys):
    root = _data_folder(tmp_path / "data")
    run, out = tmp_path / "run", tmp_path / "model"
    args = ["train", "--data", str(root), "--taef2", str(TAEF2), "--run", str(run)]
    steps = ["--steps", "3", *SMOKE[2:]]
    assert main([*args, *steps, "--until", "4"]) == 2
    assert "--until: must be within 1..--steps (3), got 4" in capsys.readouterr().err
    assert main([*args, *steps, "--until", "1", "--out", str(out)]) == 0
    training = json.loads((out / "training.json").read_text())
    assert training["trained_steps"] == 1 and training["config"]["steps"] == 3
    assert "1 of a 3-step schedule" in (out / "README.md").read_text()
    # the rest of the run resumes from the part's checkpoint
    assert main([*args, *steps, "--out", str(out)]) == 0
    assert "resumed from" in capsys.readouterr().err
    assert json.loads((out / "training.json").read_text())["trained_steps"] == 3


def test_expression_labels_refuses_bad_arguments_naming_them(tmp_path, capsys):
    from facefuse.train import expression_labels

    out = str(tmp_path / "e.csv")
    with pytest.raises(SystemExit):
        expression_labels.main(["--heldout-from", str(tmp_path / "none.json"), "--out", out])
    assert "--heldout-from" in capsys.readouterr().err
    (tmp_path / "t.json").write_text('{"heldout_london_ids": []}')
    with pytest.raises(SystemExit):
        expression_labels.main(["--heldout-from", str(tmp_path / "t.json"), "--out", out,
                                "--data", str(tmp_path / "missing")])  # fmt: skip
    assert "--data" in capsys.readouterr().err
    assert expression_labels.label(None) == "" and expression_labels.label(0.05) == "neutral"
    assert expression_labels.label(0.4) == "" and expression_labels.label(0.9) == "smiling"
