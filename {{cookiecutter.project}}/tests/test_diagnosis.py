"""The verdict follows the measured three-way split, the system load and the hardware; its suggestions are
records whose switches exist, each with the fact behind it. Machines are described, never assumed."""
import re

import pytest

from {{ cookiecutter.package }} import options
from {{ cookiecutter.package }}.core.hardware import Hardware
from {{ cookiecutter.package }}.diagnosis.ranks import RankTimes, spread, straggler
from {{ cookiecutter.package }}.diagnosis import verdict
from {{ cookiecutter.package }}.diagnosis.verdict import Settings, bound, diagnose
from {{ cookiecutter.package }}.loop.clock import Window

from helpers.machines import AVX2, MACHINES, SM70, SM90

DEFAULTS = Settings(num_workers=2, prefetch_factor=2, pin_memory=True, persistent_workers=False)


def window(data_frac: float, host_frac: float = 0.0) -> Window:
    return Window(steps=10, images=640, wall_s=1.0, data_s=data_frac, host_s=host_frac)


def settings(**changes) -> Settings:
    return Settings(**{**vars(DEFAULTS), **changes})


def cores(hardware: Hardware, count: int) -> Hardware:
    return Hardware(**{**vars(hardware), "cores": count})


def switches(diagnosis) -> set[str]:
    return {f"{suggestion.key}={suggestion.value}" for suggestion in diagnosis.suggestions}


def held(diagnosis) -> set[str]:
    return {f"{suggestion.key}={suggestion.value}" for suggestion in diagnosis.withheld}


def offered_on_a_gpu(group: str, option: str) -> bool:
    """Whether the option's tests have passed on a GPU (its facts' passed_on): the verdict withholds it there if not."""
    return options.facts(group, option).passed("cuda")


@pytest.mark.parametrize(("data", "host", "expected"), [
    (0.02, 0.0, "compute"), (0.09, 0.09, "compute"), (0.12, 0.05, "data"), (0.05, 0.15, "host"),
    (0.6, 0.2, "data"), (0.2, 0.25, "host")])
def test_bound_is_the_larger_noticeable_idle_share(data, host, expected):
    assert bound({"data": data, "host": host}) == expected


def test_on_a_cpu_the_cores_the_loader_takes_from_the_step_are_a_data_cost():
    """The step and the workers share the cores: a 1% wait with workers on 30% of them is data-bound on a CPU,
    where the same figures on a GPU, which computes apart from them, are not."""
    busy_loader = {"sys/cpu_util": 99.0, "sys/loader_cpu": 30.0}
    on_a_cpu = diagnose(window(0.01), busy_loader, AVX2, settings(choices={"decoder": "pil", "format": "folder"}))
    assert on_a_cpu.bound == "data" and on_a_cpu.data_cost == pytest.approx(0.01 + 0.99 * 0.30)
    assert "the loader's workers took 30% of the cores the step computes on" in on_a_cpu.verdict
    decoder = next(suggestion for suggestion in on_a_cpu.suggestions if suggestion.key == "decoder")
    assert decoder.value == options.fastest_cpu_decoder() and "took 30% of the 2 cores" in decoder.fact
    costs = [options.facts("decoder", name).decode_us for name in (decoder.value, "pil")]
    assert f"it takes {costs[0]:.0f} µs a training image where decoder=pil takes {costs[1]:.0f}" in decoder.fact
    assert any(suggestion.key == "format" and suggestion.value == "tensor" for suggestion in on_a_cpu.suggestions)
    on_a_gpu = diagnose(window(0.01), busy_loader, SM90, DEFAULTS)
    assert on_a_gpu.bound == "compute" and on_a_gpu.data_cost == pytest.approx(0.01)


FITS = "the pack's 47.0 MiB fit in the cpu's 20.10 GiB free with staging.reserve_gb=8 to spare"


@pytest.mark.parametrize("machine", ["avx2", "sm90"])
def test_a_data_bound_run_on_a_pixel_pack_that_fits_is_told_to_hold_it_on_the_device(machine):
    """Advised where the staging on the device has passed its tests (its facts' passed_on), withheld elsewhere with
    that fact; never where the pack does not fit (no pack_fits)."""
    hardware, staging = MACHINES[machine], options.only("staging", "on_device")
    starved = settings(choices={"format": "tensor", "decoder": "none"}, pack_fits=FITS)
    diagnosis = diagnose(window(0.5), {"sys/cpu_util": 60.0}, hardware, starved)
    passed = options.facts("staging", staging).passed(hardware.device)
    advised = [suggestion for suggestion in diagnosis.suggestions if suggestion.key == "staging"]
    held = [suggestion for suggestion in diagnosis.withheld if suggestion.key == "staging"]
    assert [suggestion.value for suggestion in advised + held] == [staging]
    (suggestion,) = advised or held
    assert bool(advised) == passed and FITS in suggestion.fact
    assert diagnosis.suggestions[0] is suggestion if passed else "alone" in suggestion.fact
    unfitting = diagnose(window(0.5), {"sys/cpu_util": 60.0}, hardware, settings(choices=starved.choices))
    assert "staging" not in {suggestion.key for suggestion in unfitting.suggestions + unfitting.withheld}


def test_compute_bound():
    diagnosis = diagnose(window(0.02), {"sys/cpu_util": 50.0}, cores(AVX2, 8), DEFAULTS)
    assert diagnosis.bound == "compute"
    assert diagnosis.verdict == "Data loading is not the bottleneck: the CPU waited for data 2% of the time."
    assert any("train.batch_size" in line for line in diagnosis.advice)


def test_the_verdict_names_the_gpu_in_words():
    """As seen on an H100, once worded "the cuda waited for data 0% of the time"."""
    computing = Window(steps=10, images=640, wall_s=1.0, data_s=0.0, host_s=0.02)
    assert diagnose(computing, {}, SM90, DEFAULTS).verdict == (
        "Data loading is not the bottleneck: the GPU waited for data 0% of the time. The GPU computed 98% of the time.")
    assert "(the GPU computed 98% of the time; " in diagnose(computing, {}, SM90, DEFAULTS).advice[0]


@pytest.mark.parametrize(("machine", "faster", "held"), [
    ("avx2", None, "precision=bf16"), ("avx512_bf16", "precision=bf16", None), ("sm61", None, "precision=bf16"),
    ("sm70", "precision=fp16", "precision=bf16"), ("sm90", "precision=bf16", None)])
def test_a_precision_is_suggested_only_where_the_hardware_computes_it_natively(machine, faster, held):
    hardware = MACHINES[machine]
    diagnosis = diagnose(window(0.02), {"sys/cpu_util": 50.0}, hardware, DEFAULTS)
    precisions = {switch for switch in switches(diagnosis) if switch.startswith("precision=")}
    assert precisions == ({faster} if faster else set())
    assert {f"{held_back.key}={held_back.value}" for held_back in diagnosis.withheld
            if held_back.key == "precision"} == ({held} if held else set())
    if not hardware.native_bf16:
        assert not any("precision=bf16" in line for line in diagnosis.advice), "nothing advises bf16 where emulated"
    suggestion = next((suggestion for suggestion in diagnosis.suggestions if suggestion.key == "precision"), None)
    if suggestion:  # the fact names the hardware that makes it apply
        assert (hardware.gpu or hardware.cpu) in suggestion.fact and suggestion.tunable


def test_precision_bf16_where_it_is_emulated_is_advised_back_to_fp32():
    diagnosis = diagnose(window(0.02), {}, AVX2, settings(precision="bf16"))
    precision = next(suggestion for suggestion in diagnosis.suggestions if suggestion.key == "precision")
    assert precision.value == "fp32" and "emulated" in precision.fact and "AMD EPYC" in precision.fact


def test_the_tensor_core_switches_need_tensor_cores():
    for machine in ("avx2", "avx512_bf16", "sm61"):
        named = switches(diagnose(window(0.02, 0.01), {}, MACHINES[machine], DEFAULTS))
        assert not named & {"model.channels_last=true", "model.compile=true", "cudnn=benchmark"}, machine
    for machine in ("sm70", "sm90"):
        named = switches(diagnose(window(0.02, 0.01), {}, MACHINES[machine], DEFAULTS))
        assert {"model.channels_last=true", "model.compile=true", "cudnn=benchmark"} <= named, machine


def test_cudnn_benchmark_rests_on_fixed_shapes():
    benchmark = next(suggestion for suggestion in diagnose(window(0.02), {}, SM90, DEFAULTS).suggestions
                     if suggestion.key == "cudnn")
    assert "one shape" in benchmark.fact and "224 pixels" in benchmark.fact


def test_compute_bound_gpu_names_the_compute_switches_not_yet_on():
    advice = diagnose(window(0.02, 0.01), {}, SM90, DEFAULTS).advice
    for switch in ("precision=bf16", "model.channels_last=true", "model.compile=true", "cudnn=benchmark"):
        assert any(switch in line for line in advice), switch
    tuned = settings(precision="bf16", channels_last=True, compile=True, cudnn="benchmark")
    advice = diagnose(window(0.02, 0.01), {}, SM90, tuned).advice
    assert len(advice) == 1 and "Compute sets the pace" in advice[0]


def test_host_bound_gpu_asks_for_fewer_launches_and_syncs_not_for_loader_switches():
    diagnosis = diagnose(window(0.03, 0.55), {"sys/cpu_util": 20.0}, cores(SM90, 8), settings(precision="fp16"))
    assert diagnosis.bound == "host"
    assert diagnosis.verdict.startswith("The host is the bottleneck: the GPU sat idle 55% of the time")
    for switch in ("model.compile=true", "train.batch_size", "model.channels_last=true", "precision=bf16",
                   "train.log_every"):
        assert any(switch in line for line in diagnosis.advice), switch
    assert not any("loader." in line or "decoder=" in line or "prefetcher=" in line for line in diagnosis.advice)
    compiled = diagnose(window(0.03, 0.2), {}, cores(SM90, 8), settings(compile=True, log_every=100))
    assert "a partial bottleneck" in compiled.verdict
    assert not any("train.log_every" in line for line in compiled.advice)
    assert "model.compile=true" not in switches(compiled)
    before_ampere = diagnose(window(0.03, 0.55), {}, SM70, settings(precision="fp16"))
    assert not any("precision=bf16" in line for line in before_ampere.advice), "fp16 stays: no bf16 tensor cores"


@pytest.mark.parametrize("passed_on", [(), ("cuda",)], ids=["graphs untested on a GPU", "graphs passed on a GPU"])
def test_cuda_graphs_are_advised_to_a_host_bound_gpu_only_where_their_test_has_passed(passed_on, monkeypatch):
    monkeypatch.setattr(verdict, "GRAPHS_PASSED_ON", passed_on)
    graphs = "model.compile_mode=reduce-overhead"
    compiled = diagnose(window(0.03, 0.2), {}, cores(SM90, 8), settings(compile=True))
    assert (graphs in switches(compiled), graphs in held(compiled)) == ((True, False) if passed_on else (False, True))
    if not passed_on:
        (why,) = [suggestion for suggestion in compiled.withheld if suggestion.key == "model.compile_mode"]
        assert why.fact.startswith("its tests have passed on no device yet; the GPU sat idle") and not why.tunable
    for cannot_gain in (settings(compile=True, cuda_graphs=True), settings(compile=True, graphs_refused="accumulates")):
        diagnosis = diagnose(window(0.03, 0.2), {}, cores(SM90, 8), cannot_gain)
        assert graphs not in switches(diagnosis) | held(diagnosis)
    on_a_cpu = diagnose(window(0.03, 0.2), {}, cores(AVX2, 8), settings(compile=True))
    assert graphs not in switches(on_a_cpu) | held(on_a_cpu)


def test_both_idle_shares_noticeable_give_both_kinds_of_advice_the_bound_first():
    advice = diagnose(window(0.2, 0.3), {"sys/cpu_util": 30.0}, SM90, DEFAULTS).advice
    host_line = next(i for i, line in enumerate(advice) if "model.compile" in line)
    data_line = next(i for i, line in enumerate(advice) if "loader.num_workers=16" in line)
    assert host_line < data_line


@pytest.mark.parametrize("count", [2, 64])
def test_data_bound_with_idle_cores_asks_for_one_worker_per_core_this_process_has(count):
    diagnosis = diagnose(window(0.6), {"sys/cpu_util": 30.0, "sys/iowait": 0.0}, cores(SM90, count),
                         settings(num_workers=1))
    assert diagnosis.bound == "data"
    assert diagnosis.verdict.startswith("Data loading is the bottleneck") and "60%" in diagnosis.verdict
    workers = next(suggestion for suggestion in diagnosis.suggestions if suggestion.key == "loader.num_workers")
    assert workers.value == str(count) and f"{count} cores" in workers.fact and "30% busy" in workers.fact
    assert not any("persistent_workers" in line for line in diagnosis.advice)  # no epoch-start figure: no evidence
    assert not any("model.compile" in line for line in diagnosis.advice)
    enough = diagnose(window(0.6), {"sys/cpu_util": 30.0}, cores(SM90, count), settings(num_workers=count))
    assert "loader.num_workers" not in {suggestion.key for suggestion in enough.suggestions}


def test_data_bound_on_saturated_cpu_does_not_ask_for_workers():
    advice = diagnose(window(0.6), {"sys/cpu_util": 97.0, "sys/iowait": 0.0}, SM90, DEFAULTS).advice
    assert any("saturated" in line for line in advice)
    assert not any("loader.num_workers" in line for line in advice)


def test_disk_bound_points_at_storage():
    advice = diagnose(window(0.5), {"sys/cpu_util": 30.0, "sys/iowait": 40.0}, SM90, DEFAULTS).advice
    assert "iowait 40%" in advice[0]


# Measured by the loader's workers (data.images.ReadTimes): on a slow disk, reads take most of each image's time,
# while iowait, which waits on FUSE or network storage barely raise, stays low.
ON_SLOW_STORAGE = {"sys/cpu_util": 40.0, "sys/iowait": 2.0, "sys/loader_cpu": 15.0, "loader/read_ms": 31.0,
                   "loader/decode_ms": 6.0, "loader/read_share": 84.0}
DECODING = {"sys/cpu_util": 60.0, "sys/iowait": 0.0, "sys/loader_cpu": 15.0, "loader/read_ms": 0.2,
            "loader/decode_ms": 9.0, "loader/read_share": 2.0}


@pytest.mark.parametrize("machine", ["avx2", "sm90"])
def test_workers_waiting_on_reads_get_the_storage_verdict_and_storage_advice(machine):
    hardware = MACHINES[machine]
    folder = settings(num_workers=2, choices={"decoder": "pil", "format": "folder", "staging": "none"})
    diagnosis = diagnose(window(0.35), ON_SLOW_STORAGE, hardware, folder)
    assert diagnosis.bound == "data"
    assert "workers were waiting on storage" in diagnosis.verdict and "84% of each image's time" in diagnosis.verdict
    packs = options.having("format", "packed_for_storage")
    assert {f"loader.num_workers={2 * hardware.cores}", "staging=tmpfs", f"format={packs[0]}"} <= switches(diagnosis)
    assert not any(suggestion.key == "decoder" for suggestion in diagnosis.suggestions)
    storage = [s for s in diagnosis.suggestions if s.key in ("loader.num_workers", "staging", "format")]
    assert len(storage) == 3 and all("31.0 ms a read" in suggestion.fact for suggestion in storage)
    more = diagnose(window(0.35), ON_SLOW_STORAGE, hardware, settings(num_workers=2 * hardware.cores))
    assert f"loader.num_workers={4 * hardware.cores}" in switches(more)
    assert not {suggestion.key for suggestion in diagnosis.suggestions} & {"order"}  # files are not read in runs
    pack = next(suggestion for suggestion in diagnosis.suggestions if suggestion.key == "format")
    assert pack.change == {"format": packs[0], "order": options.having("order", "in_runs")[0]}  # never read at random
    packed = settings(num_workers=2, choices={"format": "lmdb", "order": "random"})
    in_runs = options.having("order", "in_runs")
    assert {f"order={option}" for option in in_runs} <= switches(diagnose(window(0.35), ON_SLOW_STORAGE, hardware, packed))
    read_in_runs = settings(num_workers=2, choices={"format": "lmdb", "order": in_runs[0]})
    assert "order" not in {s.key for s in diagnose(window(0.35), ON_SLOW_STORAGE, hardware, read_in_runs).suggestions}


def test_a_format_that_streams_is_told_where_its_chunks_go_not_to_stage_what_it_does_not_copy():
    streamed = next(name for name in options.options("format") if options.facts("format", name).streams)
    diagnosis = diagnose(window(0.35), ON_SLOW_STORAGE, AVX2, settings(num_workers=2, choices={"format": streamed}))
    assert not any(suggestion.key == "staging" for suggestion in diagnosis.suggestions)
    direction = next(suggestion for suggestion in diagnosis.suggestions if suggestion.key == "format.cache_dir")
    assert not direction.tunable and options.facts("format", streamed).streams in direction.why


@pytest.mark.parametrize("machine", ["avx2", "sm90"])
def test_workers_busy_decoding_get_the_decode_verdict_and_no_storage_advice(machine):
    folder = settings(num_workers=1, choices={"decoder": "pil", "format": "folder", "staging": "none"})
    diagnosis = diagnose(window(0.35), DECODING, MACHINES[machine], folder)
    assert "workers were busy decoding" in diagnosis.verdict and "98% of each image's time" in diagnosis.verdict
    assert not {"staging=tmpfs", "format=lmdb", "format=hdf5"} & switches(diagnosis)
    assert {"loader.num_workers", "decoder"} & {suggestion.key for suggestion in diagnosis.suggestions}


# With a batch decoder (facts: gpu) the workers only read the bytes and walk the headers: their read share is about
# 90% even from the page cache. Where the time goes is the training process's own figure (data.device.UploadTimes):
# decoding each batch on the device, or waiting for the workers' batch.
DECODING_ON_THE_DEVICE = {"sys/cpu_util": 30.0, "sys/iowait": 0.0, "sys/loader_cpu": 5.0, "loader/read_ms": 0.3,
                          "loader/decode_ms": 0.03, "loader/read_share": 91.0, "loader/upload_ms": 42.0,
                          "loader/upload_share": 88.0}
WAITING_FOR_THE_WORKERS = {**DECODING_ON_THE_DEVICE, "loader/upload_ms": 3.0, "loader/upload_share": 12.0}
BATCH_DECODERS = [name for name in options.options("decoder") if options.facts("decoder", name).gpu]


@pytest.mark.parametrize("decoder", BATCH_DECODERS)
def test_a_run_waiting_on_the_devices_decoding_is_not_told_to_stage_pack_or_add_workers(decoder):
    batch = settings(num_workers=2, choices={"decoder": decoder, "format": "folder", "staging": "none"})
    diagnosis = diagnose(window(0.4), DECODING_ON_THE_DEVICE, SM90, batch)
    assert diagnosis.bound == "data" and "waiting on storage" not in diagnosis.verdict
    assert "The training process was decoding" in diagnosis.verdict and "88% of the time" in diagnosis.verdict
    assert not {"staging", "format", "order", "loader.num_workers", "loader.prefetch_factor"} & {
        suggestion.key for suggestion in diagnosis.suggestions}, diagnosis.advice
    decoders = [suggestion for suggestion in diagnosis.suggestions if suggestion.key == "decoder"]
    assert all("42.0 ms a batch" in suggestion.fact for suggestion in decoders)
    assert f"decoder={options.fastest_cpu_decoder()}" in switches(diagnosis)  # the CPU is 30% busy: room to decode
    regional = {f"decoder={name}" for name in BATCH_DECODERS if options.facts("decoder", name).region_decode
                and not options.facts("decoder", name).missing()}
    if options.facts("decoder", decoder).region_decode:
        assert not regional & (switches(diagnosis) | held(diagnosis))
    else:  # offered where their tests have passed on a GPU, withheld where not
        assert {name for name in regional if offered_on_a_gpu("decoder", name[8:])} <= switches(diagnosis)
        assert {name for name in regional if not offered_on_a_gpu("decoder", name[8:])} <= held(diagnosis)
    # The same figures from a decoder whose workers decode: those workers did wait on storage.
    in_workers = settings(num_workers=2, choices={"decoder": "pil", "format": "folder", "staging": "none"})
    assert "waiting on storage" in diagnose(window(0.4), DECODING_ON_THE_DEVICE, SM90, in_workers).verdict


@pytest.mark.parametrize("decoder", BATCH_DECODERS)
def test_a_batch_decoders_workers_are_judged_by_iowait_not_by_their_read_share(decoder):
    batch = settings(num_workers=2, choices={"decoder": decoder, "format": "folder", "staging": "none"})
    waiting = diagnose(window(0.4), WAITING_FOR_THE_WORKERS, SM90, batch)
    assert "waiting for the loader's workers" in waiting.verdict and "88% of the time" in waiting.verdict
    assert not {"staging", "format"} & {suggestion.key for suggestion in waiting.suggestions}
    assert "loader.num_workers=16" in switches(waiting)  # they fall behind with the cores 30% busy: more of them
    on_disk = diagnose(window(0.4), {**WAITING_FOR_THE_WORKERS, "sys/iowait": 40.0}, SM90, batch)
    assert {"staging=tmpfs", f"format={options.having('format', 'packed_for_storage')[0]}"} <= switches(on_disk)
    assert all("iowait 40%" in suggestion.fact for suggestion in on_disk.suggestions if suggestion.key == "staging")


def test_partial_bottleneck_and_pageable_copies():
    loader = settings(pin_memory=False, persistent_workers=True)
    diagnosis = diagnose(window(0.2), {"sys/cpu_util": 30.0}, cores(SM90, 4), loader)
    assert "a partial bottleneck" in diagnosis.verdict
    assert any("loader.pin_memory=true" in line for line in diagnosis.advice)
    assert not any("persistent_workers" in line for line in diagnosis.advice)
    on_a_cpu = diagnose(window(0.2), {"sys/cpu_util": 30.0}, AVX2, loader)
    assert not {"loader.pin_memory", "prefetcher"} & {suggestion.key for suggestion in on_a_cpu.suggestions}


def test_saturated_cpu_points_at_lighter_decoding_that_the_run_does_not_use_yet():
    busy = {"sys/cpu_util": 97.0, "sys/iowait": 0.0}
    on_a_gpu = diagnose(window(0.6), busy, SM90, settings(choices={"decoder": "pil", "format": "folder"}))
    advice = on_a_gpu.advice
    assert any(f"decoder={options.fastest_cpu_decoder()}" in line for line in advice)
    for decoder in options.gpu_options("decoder"):  # offered where its tests have passed on a GPU, withheld elsewhere
        assert f"decoder={decoder}" in (switches if offered_on_a_gpu("decoder", decoder) else held)(on_a_gpu)
    assert any("format=tensor" in line for line in advice)
    on_a_cpu = diagnose(window(0.6), busy, AVX2, settings(choices={"decoder": "pil", "format": "folder"})).advice
    assert not any("decoder=nvjpeg" in line or "decoder=dali" in line for line in on_a_cpu), "no GPU to decode on"
    tensor = settings(choices={"decoder": "none", "format": "tensor"})
    advice = diagnose(window(0.6), busy, AVX2, tensor).advice
    assert not any("decoder=" in line for line in advice) and any("Nothing is decoded" in line for line in advice)


def test_disk_bound_points_at_staging_and_packing_unless_already_used():
    disk = {"sys/cpu_util": 30.0, "sys/iowait": 40.0}
    advice = diagnose(window(0.5), disk, SM90, settings(choices={"staging": "none", "format": "folder"})).advice
    assert any("staging=tmpfs" in line for line in advice) and any("format=lmdb" in line for line in advice)
    advice = diagnose(window(0.5), disk, SM90, settings(choices={"staging": "tmpfs", "format": "lmdb"})).advice
    assert not any("staging=tmpfs" in line or "format=lmdb" in line for line in advice)


def test_every_suggestion_is_a_record_with_its_fact_and_its_line_is_rendered_from_it():
    cases = [window(0.02), window(0.6), window(0.02, 0.6)]
    systems = [{}, {"sys/cpu_util": 30.0}, {"sys/cpu_util": 97.0}, {"sys/iowait": 50.0}, ON_SLOW_STORAGE]
    for hardware in MACHINES.values():
        for total in cases:
            for system in systems:
                diagnosis = diagnose(total, system, hardware, settings(precision="fp16" if hardware.on_gpu else "fp32"))
                assert len(diagnosis.advice) == len(diagnosis.suggestions)
                for suggestion, line in zip(diagnosis.suggestions, diagnosis.advice):
                    assert suggestion.fact and suggestion.side in ("data", "host", "compute")
                    assert line.endswith(f"({suggestion.fact}).") and line.startswith(suggestion.why)
                    assert all(f"{key}={value}" in line for key, value in suggestion.change.items())


def test_the_same_measurements_give_the_same_suggestions():
    first = diagnose(window(0.4), {"sys/cpu_util": 40.0}, SM90, DEFAULTS)
    again = diagnose(window(0.4), {"sys/cpu_util": 40.0}, SM90, DEFAULTS)
    assert first == again


def test_every_switch_the_advice_names_exists():
    """Every group=option and key=value of any suggestion, on any described machine, is a real option or key."""
    from omegaconf import OmegaConf

    from helpers.paths import CONF

    keys = OmegaConf.merge(OmegaConf.load(CONF / "train.yaml"), OmegaConf.load(CONF / "pack.yaml"),
                           {"model": OmegaConf.load(CONF / "model/torchvision.yaml"),
                            "optim": OmegaConf.load(CONF / "optim/sgd.yaml")})
    cases = [window(0.02), window(0.6), window(0.02, 0.6), window(0.6)]
    systems = [{}, {"sys/cpu_util": 30.0}, {"sys/cpu_util": 97.0}, {"sys/iowait": 50.0}, ON_SLOW_STORAGE]
    starting = Settings(num_workers=1, prefetch_factor=2, pin_memory=False, persistent_workers=False, precision="fp16")
    suggestions = [suggestion for total in cases for system in systems for hardware in MACHINES.values()
                   for suggestion in diagnose(total, system, hardware, starting).suggestions]
    named = {suggestion.key for suggestion in suggestions} | {key for s in suggestions for key in s.also}
    assert {"decoder", "format", "staging", "prefetcher", "loader.num_workers", "model.compile",
            "model.channels_last", "precision", "cudnn"} <= named
    for suggestion in suggestions:
        for key, value in [(suggestion.key, suggestion.value), *suggestion.also.items()]:
            if (CONF / key).is_dir():
                assert (CONF / key / f"{value}.yaml").is_file(), (key, value)
            else:
                assert OmegaConf.select(keys, key, default="absent") != "absent", key
    lines = " ".join(suggestion.line() for suggestion in suggestions)
    for key in ("train.batch_size", "train.log_every", "optim.lr"):  # named without a value
        assert key in lines and OmegaConf.select(keys, key, default="absent") != "absent", key
    assert not re.search(r"=None\b", lines)


def epochs(start_s: float, persistent: bool):
    """A diagnosis of a compute-bound run whose epochs after the first each waited `start_s` for their first batch."""
    timed = Window(steps=30, images=120, wall_s=3.0, data_s=0.1 + 3 * start_s, epoch_start_s=3 * start_s,
                   epoch_starts=3)
    return diagnose(timed, {"sys/cpu_util": 40.0}, AVX2, settings(persistent_workers=persistent))


def test_workers_started_again_at_every_epoch_are_named_only_when_the_epoch_start_costs_a_share_of_it():
    restarting = epochs(start_s=0.2, persistent=False)  # 0.6 s of 3 s: 20%
    (keep,) = [suggestion for suggestion in restarting.suggestions if suggestion.key == "loader.persistent_workers"]
    assert keep.value == "true" and keep.tunable
    assert "waited 200 ms for its first batch, 20% of the time" in keep.fact and "(or start fewer)" in keep.why
    assert "loader.persistent_workers" not in switches(epochs(start_s=0.01, persistent=False))  # 1%: noise
    assert not any("persistent_workers" in line for line in epochs(start_s=0.2, persistent=True).advice)


def ranks_waiting(*data_fracs: float, host_frac: float = 0.0) -> list[RankTimes]:
    return [RankTimes(rank, f"node{rank}", Window(steps=10, images=40, wall_s=1.0, data_s=data, host_s=host_frac))
            for rank, data in enumerate(data_fracs)]


def test_a_rank_that_waits_for_data_far_more_than_the_others_is_named_with_its_host_and_no_global_switch():
    ranks = ranks_waiting(0.03, 0.41, 0.05, 0.04)
    diagnosis = diagnose(ranks[1].window, {"sys/cpu_util": 30.0}, cores(SM90, 8), DEFAULTS, ranks)
    assert diagnosis.bound == "data"
    assert diagnosis.verdict == ("Rank 1 on host node1 holds the others back: it waited for data 41% of the time; "
                                 "the others 3-5%.")
    (look,) = diagnosis.suggestions
    assert look.key == "data.root" and look.value is None and not look.tunable and "host node1's disk" in look.why
    assert "rank 1" not in look.why and "41%" in look.fact


@pytest.mark.parametrize("shares", [(0.03, 0.05), (0.40, 0.45), (0.05, 0.30, 0.10, 0.32), (0.12,)])
def test_no_rank_is_named_when_none_stands_out_of_the_others_spread(shares):
    ranks = ranks_waiting(*shares)
    assert straggler(ranks) is None
    assert not diagnose(ranks[0].window, {"sys/cpu_util": 30.0}, SM90, DEFAULTS, ranks).verdict.startswith("Rank")


def test_a_rank_whose_gpu_waits_on_its_host_points_at_that_hosts_cores():
    ranks = ranks_waiting(0.02, 0.02, host_frac=0.0)
    ranks[0] = RankTimes(0, "node0", Window(steps=10, images=40, wall_s=1.0, data_s=0.02, host_s=0.35))
    lagging = straggler(ranks)
    assert (lagging.times.rank, lagging.side) == (0, "host")
    assert "host node0's cores" in lagging.suggestion().why


def test_the_spread_of_one_window_names_the_extremes_and_the_rank_that_idled_most():
    ranks = ranks_waiting(0.03, 0.41, 0.05)
    assert spread([times.window for times in ranks]) == pytest.approx({
        "ranks/data_frac_max": 0.41, "ranks/data_frac_min": 0.03, "ranks/host_frac_max": 0.0,
        "ranks/host_frac_min": 0.0, "ranks/slowest": 1.0})
