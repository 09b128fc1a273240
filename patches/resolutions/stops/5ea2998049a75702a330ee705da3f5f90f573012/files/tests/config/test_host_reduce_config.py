# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Checks of the host all-reduce's switches in ParallelConfig (no GPU needed).

Configs of several ranks name the multiprocessing backend: left to choose,
ParallelConfig refuses a world size larger than the GPUs it counts, which
would make these checks depend on the machine."""

import pytest

from vllm.config.parallel import HostAllReduceConfig, ParallelConfig
from vllm.engine.arg_utils import EngineArgs, get_kwargs
from vllm.utils.argparse_utils import FlexibleArgumentParser


def test_defaults():
    # Opt-in: it creates and pins a /dev/shm segment.
    assert ParallelConfig.enable_host_all_reduce is False
    config = HostAllReduceConfig()
    assert config.max_bytes == 256 * 1024
    assert config.timeout_s == 600.0
    assert ParallelConfig().host_all_reduce_config == config


@pytest.mark.parametrize("max_bytes", [0, -16, 1000, 262143])
def test_max_bytes_must_be_positive_multiple_of_16(max_bytes):
    with pytest.raises(ValueError, match="max_bytes"):
        HostAllReduceConfig(max_bytes=max_bytes)


@pytest.mark.parametrize("timeout_s", [0, -1.0])
def test_timeout_must_be_positive(timeout_s):
    with pytest.raises(ValueError, match="timeout_s"):
        HostAllReduceConfig(timeout_s=timeout_s)


def test_nested_from_dict():
    config = ParallelConfig(
        tensor_parallel_size=2,
        distributed_executor_backend="mp",
        enable_host_all_reduce=True,
        host_all_reduce_config={"max_bytes": 65536, "timeout_s": 30},
    )
    assert isinstance(config.host_all_reduce_config, HostAllReduceConfig)
    assert config.host_all_reduce_config.max_bytes == 65536
    assert config.host_all_reduce_config.timeout_s == 30.0
    with pytest.raises(ValueError):
        ParallelConfig(host_all_reduce_config={"max_bytes": 100})
    with pytest.raises(ValueError):
        ParallelConfig(host_all_reduce_config={"unknown_field": 1})


@pytest.mark.parametrize("tensor_parallel_size", [1, 4])
def test_needs_two_tensor_parallel_ranks(tensor_parallel_size):
    with pytest.raises(ValueError, match="groups of two ranks"):
        ParallelConfig(
            tensor_parallel_size=tensor_parallel_size,
            distributed_executor_backend="mp",
            enable_host_all_reduce=True,
        )
    # Off, any size is fine.
    ParallelConfig(
        tensor_parallel_size=tensor_parallel_size, distributed_executor_backend="mp"
    )


def test_cli_flags():
    # The flags EngineArgs.add_cli_args derives from the two fields.
    kwargs = get_kwargs(ParallelConfig)
    parser = FlexibleArgumentParser()
    parser.add_argument("--enable-host-all-reduce", **kwargs["enable_host_all_reduce"])
    parser.add_argument("--host-all-reduce-config", **kwargs["host_all_reduce_config"])
    args = parser.parse_args(
        [
            "--enable-host-all-reduce",
            "--host-all-reduce-config.max_bytes",
            "65536",
            "--host-all-reduce-config.timeout_s",
            "30",
        ]
    )
    assert args.enable_host_all_reduce is True
    engine_args = EngineArgs(
        enable_host_all_reduce=args.enable_host_all_reduce,
        host_all_reduce_config=args.host_all_reduce_config,
    )
    assert engine_args.host_all_reduce_config == HostAllReduceConfig(
        max_bytes=65536, timeout_s=30
    )
    defaults = parser.parse_args([])
    assert defaults.enable_host_all_reduce is False
    assert EngineArgs().host_all_reduce_config == HostAllReduceConfig()


def test_not_a_compile_factor():
    # The all-reduce is an opaque op: neither the compiled graph nor the
    # collectives that data-parallel ranks must agree on change.
    assert (
        ParallelConfig(
            tensor_parallel_size=2, distributed_executor_backend="mp"
        ).compile_factors()
        == ParallelConfig(
            tensor_parallel_size=2,
            distributed_executor_backend="mp",
            enable_host_all_reduce=True,
            host_all_reduce_config={"max_bytes": 65536, "timeout_s": 5},
        ).compile_factors()
    )
