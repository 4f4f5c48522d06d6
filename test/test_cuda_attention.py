"""The engine turns torch's cuDNN attention off on a CUDA device (it plans per KV length)."""

import pytest
import torch

from timebill_ros.engine import loading
from timebill_ros.engine.forward import avoid_cudnn_attention


@pytest.fixture
def cudnn_flag():
    """Restore torch's process-wide cuDNN attention flag after the test."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


def test_a_cpu_device_leaves_the_flag(cudnn_flag):
    assert avoid_cudnn_attention('cpu') is False
    assert avoid_cudnn_attention(torch.device('cpu')) is False
    assert torch.backends.cuda.cudnn_sdp_enabled()


@pytest.mark.parametrize('device', ['cuda', 'cuda:1', torch.device('cuda', 0)])
def test_a_cuda_device_turns_cudnn_attention_off(cudnn_flag, device):
    assert avoid_cudnn_attention(device) is True
    assert not torch.backends.cuda.cudnn_sdp_enabled()


def test_the_engine_asks_with_its_model_device(make_tiny_engine, monkeypatch):
    asked = []
    monkeypatch.setattr(loading, 'avoid_cudnn_attention', asked.append)
    make_tiny_engine(forward='lean')
    assert asked == [torch.device('cpu')]
