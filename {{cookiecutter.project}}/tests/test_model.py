"""Fine-tuning's start: weights from a local file, from torch hub's cache or from timm's Hugging Face cache, the
classifier head fitted to the data's classes, and the inputs prepared as the weights were. Nothing is downloaded:
each test fills the cache the library reads."""
import pytest
import torch
import torchvision
from omegaconf import OmegaConf

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.contracts import Preprocessing
from {{ cookiecutter.package }}.core.config import build
from {{ cookiecutter.package }}.core.errors import ConfigError
from {{ cookiecutter.package }}.core.distributed import setup
from {{ cookiecutter.package }}.core.forensics import Forensics
from {{ cookiecutter.package }}.data.device import IMAGENET_MEAN, IMAGENET_STD
from {{ cookiecutter.package }}.data.sources import fit_preprocessing
from {{ cookiecutter.package }}.loop.checkpoint import Inference
from {{ cookiecutter.package }}.loop.model import find_head, load_weights, make_model
from {{ cookiecutter.package }}.train import make_run

from helpers.runs import hydra_run, tiny

TIMM_MISSING = options.facts("model", "timm").missing()
TIMM_TEST_MODEL = "test_resnet.r160_in1k"  # timm's own test network, 0.5 M parameters, normalised with 0.5 and 0.5


RESNET18 = "model.name=resnet18"  # the architecture the weights files below are written for


def network(compose_tiny, *overrides: str):
    return build(compose_tiny(*overrides).model)


def random_state(name: str, classes: int) -> dict[str, torch.Tensor]:
    return torchvision.models.get_model(name, weights=None, num_classes=classes).state_dict()


def starts_from(model: torch.nn.Module, state: dict, head: str) -> None:
    """Every tensor of `model` but the head's is the one in `state`."""
    mine = model.state_dict()
    assert mine.keys() == state.keys()
    assert all(torch.equal(mine[name], state[name]) for name in state if not name.startswith(f"{head}."))


def test_a_state_dict_file_starts_every_layer_and_the_head_gets_the_data_classes(compose_tiny, tmp_path):
    state = random_state("resnet18", 10)
    torch.save(state, tmp_path / "weights.pt")
    built = network(compose_tiny, RESNET18, f"model.weights={tmp_path / 'weights.pt'}")
    pretrained = load_weights(built)
    assert pretrained.classes == 10 and pretrained.preprocessing is None  # a bare state_dict says nothing of its inputs
    model = make_model(built, pretrained, data_classes=3)
    starts_from(model, {**state, "fc.weight": model.fc.weight, "fc.bias": model.fc.bias}, "fc")
    assert model.fc.out_features == 3 and model.eval()(torch.randn(2, 3, 32, 32)).shape == (2, 3)


def test_weights_of_the_data_classes_keep_their_head_too(compose_tiny, tmp_path):
    state = random_state("resnet18", 3)
    torch.save(state, tmp_path / "weights.pt")
    built = network(compose_tiny, RESNET18, f"model.weights={tmp_path / 'weights.pt'}")
    model = make_model(built, load_weights(built), data_classes=3)
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in state.items())


def test_a_safetensors_file_starts_the_model_too(compose_tiny, tmp_path):
    safetensors = pytest.importorskip("safetensors.torch", reason="reading .safetensors needs the timm extra: "
                                                                   "pip install -e '.[timm]'")
    state = random_state("resnet18", 3)
    safetensors.save_file(state, tmp_path / "weights.safetensors")
    built = network(compose_tiny, RESNET18, f"model.weights={tmp_path / 'weights.safetensors'}")
    model = make_model(built, load_weights(built), data_classes=3)
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in state.items())


def test_the_head_is_found_by_its_outputs_whatever_the_architecture():
    assert find_head(torchvision.models.mobilenet_v3_small(num_classes=7), 7, "mobilenet_v3_small") == "classifier.3"
    assert find_head(torchvision.models.squeezenet1_1(num_classes=7), 7, "squeezenet1_1") == "classifier.1"  # 1x1 conv
    assert find_head(torchvision.models.vgg11(num_classes=4096), 4096, "vgg11") == "classifier.6"  # not a hidden 4096
    with pytest.raises(ConfigError, match="model.name=plain has no Linear layer or 1x1 convolution with 7 outputs"):
        find_head(torch.nn.Sequential(torch.nn.Conv2d(3, 7, 3)), 7, "plain")


def test_torchvision_weights_by_name_come_from_torch_hubs_cache_with_their_preprocessing(compose_tiny, tmp_path,
                                                                                        monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))  # torch hub reads it at each call
    weights = torchvision.models.get_model_weights("mobilenet_v2").IMAGENET1K_V2  # trained at 224, resized to 232
    state = random_state("mobilenet_v2", 1000)
    cached = tmp_path / "torch/hub/checkpoints" / weights.url.rpartition("/")[2]
    cached.parent.mkdir(parents=True)
    torch.save(state, cached)
    built = network(compose_tiny, "model.name=mobilenet_v2", "model.weights=IMAGENET1K_V2")
    pretrained = load_weights(built)
    assert pretrained.preprocessing == Preprocessing(mean=IMAGENET_MEAN, std=IMAGENET_STD, crop_size=224, resize=232)
    model = make_model(built, pretrained, data_classes=3)
    assert model.classifier[1].out_features == 3
    starts_from(model, {**state, "classifier.1.weight": model.classifier[1].weight,
                        "classifier.1.bias": model.classifier[1].bias}, "classifier.1")


@pytest.fixture
def timm_cache(tmp_path, monkeypatch):
    """A Hugging Face cache holding TIMM_TEST_MODEL's weights (random ones, as huggingface_hub lays a download out),
    read offline; returns the weights."""
    if TIMM_MISSING:
        pytest.skip(f"model=timm: {TIMM_MISSING}")
    import timm
    from huggingface_hub import constants
    from safetensors.torch import save_file

    state = timm.create_model(TIMM_TEST_MODEL, pretrained=False).state_dict()
    repo, commit = tmp_path / "hf/hub/models--timm--test_resnet.r160_in1k", "0" * 40
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs/main").write_text(commit)  # the revision a lookup by name resolves to
    save_file({name: tensor.contiguous() for name, tensor in state.items()}, snapshot / "model.safetensors")
    # huggingface_hub reads HF_HOME and HF_HUB_OFFLINE once, when imported: its constants, set for this test.
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf/hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return state


def test_timm_weights_come_from_the_hugging_face_cache_and_their_normalisation_reaches_the_device(
        timm_cache, cache_dir, tiny_root, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    run_dir = tmp_path / "run"
    overrides = tiny(("model=timm", f"model.name={TIMM_TEST_MODEL}", "model.weights=pretrained", "logger=none"),
                     cache_dir, tiny_root)
    with hydra_run("train", overrides, run_dir) as cfg:
        run = make_run(cfg, run_dir, setup(1.0), Forensics(run_dir, 10.0, False))
    run.clock.close()
    model = run.weights.model
    assert model.fc.out_features == 3
    starts_from(model, {**timm_cache, "fc.weight": model.fc.weight, "fc.bias": model.fc.bias}, "fc")
    black_and_white = torch.tensor([0, 255], dtype=torch.uint8).view(1, 1, 2, 1).expand(1, 1, 2, 3)  # NHWC
    extremes = (black_and_white, torch.tensor([0]))
    for to_device in (run.loaders.train.to_device, run.loaders.val.to_device):  # the weights' 0.5, not ImageNet's
        normalised, _ = next(to_device.stream([extremes]))
        assert normalised.flatten().tolist() == pytest.approx([-1.0, 1.0] * 3)
    assert run.checkpoints.inference.preprocessing == Preprocessing(mean=(0.5,) * 3, std=(0.5,) * 3, crop_size=32, resize=36)


def test_timm_knows_only_its_own_word_for_its_weights(compose_tiny):
    if TIMM_MISSING:
        pytest.skip(f"model=timm: {TIMM_MISSING}")
    built = network(compose_tiny, "model=timm", f"model.name={TIMM_TEST_MODEL}", "model.weights=DEFAULT")
    with pytest.raises(ConfigError, match="model.weights=DEFAULT: timm's weights are model.weights=pretrained"):
        load_weights(built)


def test_the_weights_preprocessing_applies_where_the_data_keys_set_none():
    own = Preprocessing(mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), crop_size=160, resize=200)

    def fitted(chosen: set[str], **data) -> Preprocessing:
        node = OmegaConf.create({"crop_size": 224, "val_resize": 256, "mean": None, "std": None, **data})
        held = fit_preprocessing(node, own, chosen)
        assert (node.crop_size, node.val_resize, tuple(node.mean), tuple(node.std)) == (
            held.crop_size, held.resize, held.mean, held.std)  # what the loaders read
        return held

    assert fitted(set()) == own
    assert fitted({"crop_size"}) == Preprocessing(mean=own.mean, std=own.std, crop_size=224, resize=280)  # 200/160
    assert fitted({"crop_size", "val_resize"}, mean=[0.4, 0.4, 0.4]) == Preprocessing(
        mean=(0.4, 0.4, 0.4), std=own.std, crop_size=224, resize=256)
    node = OmegaConf.create({"crop_size": 224, "val_resize": 256, "mean": None, "std": None})
    assert fit_preprocessing(node, None, set()) == Preprocessing(mean=IMAGENET_MEAN, std=IMAGENET_STD, crop_size=224,
                                                                 resize=256)  # random weights: ImageNet's


def test_a_checkpoint_of_this_project_brings_its_preprocessing(compose_tiny, tmp_path):
    held = Preprocessing(mean=(0.3, 0.4, 0.5), std=(0.2, 0.2, 0.2), crop_size=48, resize=56)
    inference = Inference(classes=["a", "b"], preprocessing=held, model={"name": "resnet18"})
    torch.save({"model": random_state("resnet18", 2), "inference": inference.state_dict(), "step": 5},
               tmp_path / "last.pt")
    pretrained = load_weights(network(compose_tiny, RESNET18, f"model.weights={tmp_path / 'last.pt'}"))
    assert pretrained.classes == 2 and pretrained.preprocessing == held


def another_architecture(path):
    torch.save(random_state("mobilenet_v3_small", 5), path)


def wider_first_layer(path):
    torch.save({**random_state("resnet18", 5), "conv1.weight": torch.zeros(32, 3, 7, 7)}, path)


WRONG_WEIGHTS = {
    "missing.pt": (lambda path: None, "model.weights=.*missing.pt: no such file"),
    "mobilenet.pt": (another_architecture, "model.weights=.*mobilenet.pt has no fc.weight, the head of "
                                           "model.name=resnet18: it holds another architecture"),
    "wider.pt": (wider_first_layer, r"model.weights=.*wider.pt does not fit model.name=resnet18: 1 tensors differ "
                                    r"\(conv1.weight\)"),
    "garbage.pt": (lambda path: path.write_bytes(b"not a checkpoint"), "model.weights: .*garbage.pt is not a readable "
                                                                        "checkpoint"),
}


@pytest.mark.parametrize("name", WRONG_WEIGHTS)
def test_a_weights_file_that_cannot_start_the_model_is_refused_in_one_line(name, compose_tiny, tmp_path):
    write, says = WRONG_WEIGHTS[name]
    write(tmp_path / name)
    with pytest.raises(ConfigError, match=says):
        load_weights(network(compose_tiny, RESNET18, f"model.weights={tmp_path / name}"))
