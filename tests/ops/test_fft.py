"""FFTs on tpu vs CPU: every torch.fft function (through aten::_fft_r2c / _fft_c2r /
_fft_c2c, lowered to stablehlo.fft), each normalization, any dims, stft / istft, forward and
backward, eager modes and torch.compile."""
import pytest
import torch

from utils import assert_close, crand, rrand, run_cases, to_tpu, total

fft = torch.fft
# XLA's FFT (ducc) and PyTorch's (pocketfft) round differently: one transform alone differs by
# at most 8e-6 on values up to ~80 (float32), but run_cases sums a test's cases into one loss,
# weighting case k by k + 1, and the gradients then differ by up to 6.4e-5 (measured; 0.32 of
# this tolerance), while a wrong normalization (a factor sqrt(n) >= 2) or a missing conjugate
# still fails.
TOL = dict(rtol=1e-5, atol=2e-4)
NORMS = (None, "ortho", "forward")


def functions(norm):
    """(name, fn, input kind) for every transform with one normalization mode."""
    return [
        ("fft", lambda x: fft.fft(x, norm=norm), "c"), ("ifft", lambda x: fft.ifft(x, dim=1, norm=norm), "c"),
        ("rfft", lambda x: fft.rfft(x, norm=norm), "r"), ("irfft", lambda x: fft.irfft(x, norm=norm), "c"),
        ("hfft", lambda x: fft.hfft(x, n=9, norm=norm), "c"), ("ihfft", lambda x: fft.ihfft(x, dim=0, norm=norm), "r"),
        ("fft2", lambda x: fft.fft2(x, norm=norm), "c"), ("ifft2", lambda x: fft.ifft2(x, s=(5, 3), norm=norm), "c"),
        ("rfft2", lambda x: fft.rfft2(x, norm=norm), "r"), ("irfft2", lambda x: fft.irfft2(x, norm=norm), "c"),
        ("fftn", lambda x: fft.fftn(x, norm=norm), "c"), ("ifftn", lambda x: fft.ifftn(x, dim=(0, 2), norm=norm), "c"),
        ("rfftn", lambda x: fft.rfftn(x, norm=norm), "r"), ("irfftn", lambda x: fft.irfftn(x, s=(4, 3, 7), norm=norm), "c"),
        ("hfft2", lambda x: fft.hfft2(x, norm=norm), "c"), ("ihfftn", lambda x: fft.ihfftn(x, norm=norm), "r"),
        ("fft_real_in", lambda x: fft.fft(x, n=6, dim=0, norm=norm), "r"),
    ]


def cases_for(norm, grad):
    out = []
    for i, (name, fn, kind) in enumerate(functions(norm)):
        x = crand(4, 5, 6, grad=grad, seed=i) if kind == "c" else rrand(4, 5, 6, grad=grad, seed=i)
        out.append((f"{name}/{norm}", fn, [x]))
    return out


@pytest.mark.parametrize("norm", NORMS)
def test_transforms_grad(mode, norm):
    run_cases(cases_for(norm, grad=True), grad=True, tol=TOL)


def test_more_than_three_dims_and_odd_sizes(mode):
    """stablehlo.fft takes at most 3 trailing dims: more are done in groups, any dim order."""
    run_cases([
        ("fftn_4d", fft.fftn, [crand(2, 3, 4, 5, grad=True)]),
        ("rfftn_4d", fft.rfftn, [rrand(2, 3, 4, 5, grad=True)]),
        ("irfftn_4d", lambda x: fft.irfftn(x, s=(2, 3, 4, 7)), [crand(2, 3, 4, 4, grad=True)]),
        ("rfftn_dims", lambda x: fft.rfftn(x, dim=(2, 0), norm="ortho"), [rrand(3, 4, 5, grad=True)]),
        ("irfft_odd", lambda x: fft.irfft(x, n=7, dim=0), [crand(4, 3, grad=True)]),
        ("fft_pad_trim", lambda x: fft.fft(x, n=3) + fft.fft(x, n=8)[..., :3], [crand(2, 5, grad=True)]),
        ("shift", lambda x: fft.ifftshift(fft.fftshift(x * 2, dim=(0, 1)), dim=1), [crand(5, 4, grad=True)]),
    ], grad=True, tol=TOL)


def test_double_precision(mode):
    run_cases([("fft128", fft.fft, [crand(16, dtype=torch.complex128)]), ("rfft64", fft.rfft, [rrand(16).double()]),
               ("irfft128", fft.irfft, [crand(9, dtype=torch.complex128)])], tol=dict(rtol=1e-10, atol=1e-10))


def test_frequencies(mode):
    run_cases([("fftfreq", lambda x: fft.fftfreq(7, d=0.5, device=x.device) + x, [rrand(7)]),
               ("rfftfreq", lambda x: fft.rfftfreq(8, device=x.device) + x, [rrand(5)])])


def test_stft_istft(mode):
    signal = rrand(2, 200, grad=True)
    window = torch.hann_window(32)
    run_cases([
        ("stft", lambda x, w: torch.stft(x, 32, hop_length=8, window=w, return_complex=True), [signal, window]),
        ("stft_plain", lambda x: torch.stft(x, 16, center=False, onesided=False, return_complex=True), [signal]),
        ("istft", lambda x, w: torch.istft(torch.stft(x, 32, hop_length=8, window=w, return_complex=True), 32,
                                           hop_length=8, window=w, length=200), [signal, window]),
    ], grad=True, tol=TOL)


def test_compiled_spectral_filter():
    def lowpass(x):
        spectrum = fft.rfft(x, norm="ortho")
        keep = torch.arange(spectrum.shape[-1], device=x.device) < 5
        return fft.irfft(spectrum * keep, n=x.shape[-1], norm="ortho")
    x = rrand(3, 32, grad=True)
    tx = to_tpu(x)
    compiled = torch.compile(lowpass, backend="tpu")
    actual, expected = compiled(tx), lowpass(x)
    assert_close(actual, expected, **TOL)
    total([actual]).backward()
    total([expected]).backward()
    assert_close(tx.grad, x.grad, **TOL)
