"""The synchronized BatchNorm layers' arithmetic, on one process (Horovod started on this process alone, so
every allreduce returns its input): the same outputs, gradients and running statistics as the frameworks'
own BatchNorm, and a micro-batch without samples anywhere changes nothing. Across ranks:
tests/distributed/test_sync_batchnorm.py."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
hvd_torch = pytest.importorskip("horovod.torch")


@pytest.fixture(scope="module", autouse=True)
def horovod_on_this_process():
    hvd_torch.init()  # shut down at exit, by Horovod (shutting it down here crashes the TF binding's)


def _torch_pair(shape: tuple[int, ...]):
    from hvdazure.torch.sync_batchnorm import convert_sync_batchnorm

    kind = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d}[len(shape)]
    plain = kind(shape[1], dtype=torch.float64)
    with torch.no_grad():
        plain.weight.uniform_(0.5, 1.5)
        plain.bias.uniform_(-0.5, 0.5)
    synced = convert_sync_batchnorm(torch.nn.Sequential(kind(shape[1], dtype=torch.float64)))[0]
    synced.load_state_dict(plain.state_dict())
    return plain, synced


def _synced_forward(layer, x):
    from hvdazure.torch.sync_batchnorm import _SyncBatchNormFunction

    return _SyncBatchNormFunction.apply(x, layer.weight, layer.bias, layer, "hvdazure.test_sync_bn")


@pytest.mark.parametrize("shape", [(6, 4), (5, 3, 7), (3, 2, 4, 5)])
def test_torch_outputs_gradients_and_running_statistics_are_batchnorms(shape):
    plain, synced = _torch_pair(shape)
    x = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 3 + 1
    upstream = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x_plain, x_synced = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_plain, y_synced = plain(x_plain), _synced_forward(synced, x_synced)
    (y_plain * upstream).sum().backward()
    (y_synced * upstream).sum().backward()

    torch.testing.assert_close(y_synced, y_plain, rtol=0, atol=1e-12)
    torch.testing.assert_close(x_synced.grad, x_plain.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(synced.weight.grad, plain.weight.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(synced.bias.grad, plain.bias.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(synced.running_mean, plain.running_mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(synced.running_var, plain.running_var, rtol=0, atol=1e-12)
    assert int(synced.num_batches_tracked) == int(plain.num_batches_tracked) == 1


def test_torch_float32_statistics_of_data_far_from_zero_are_as_accurate_as_batchnorms():
    """Mean 1000, standard deviation 1, in float32: a variance from sums of squares would lose it to
    cancellation (E[x^2] ~ 1e6 against a variance of 1); BatchNorm's own does not, and neither may ours."""
    plain, synced = _torch_pair((256, 4))
    plain, synced = plain.float(), synced.float()
    x = torch.randn(256, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) + 1000
    expected = (x - x.mean(0)) / torch.sqrt(x.var(0, unbiased=False) + plain.eps) * plain.weight.double() \
        + plain.bias.double()
    y_plain, y_synced = plain(x.float()), _synced_forward(synced, x.float())

    error_plain = (y_plain.double() - expected).abs().max().item()
    error_synced = (y_synced.double() - expected).abs().max().item()
    assert error_synced <= max(2 * error_plain, 1e-3), (error_synced, error_plain)
    torch.testing.assert_close(synced.running_var, plain.running_var, rtol=1e-3, atol=0)


def test_torch_cumulative_average_without_momentum_is_batchnorms():
    plain, synced = _torch_pair((6, 4))
    plain.momentum = synced.momentum = None
    for seed in range(3):
        x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        plain(x)
        _synced_forward(synced, x)
    torch.testing.assert_close(synced.running_var, plain.running_var, rtol=0, atol=1e-12)
    torch.testing.assert_close(synced.running_mean, plain.running_mean, rtol=0, atol=1e-12)


def test_torch_a_micro_batch_without_samples_changes_nothing():
    _, synced = _torch_pair((6, 4))
    before = {k: v.clone() for k, v in synced.state_dict().items()}
    x = torch.zeros(0, 4, dtype=torch.float64, requires_grad=True)
    y = _synced_forward(synced, x)
    y.sum().backward()
    assert y.shape == (0, 4)
    for key, value in synced.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_torch_one_value_per_channel_over_all_ranks_is_refused_as_batchnorm_refuses_it():
    _, synced = _torch_pair((1, 4))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        _synced_forward(synced, torch.ones(1, 4, dtype=torch.float64))


def test_torch_conversion_keeps_the_state_dict_keys_and_values():
    from hvdazure.torch.sync_batchnorm import SyncBatchNorm, convert_sync_batchnorm

    model = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 1), torch.nn.BatchNorm2d(3), torch.nn.ReLU(),
                                torch.nn.Sequential(torch.nn.Flatten(), torch.nn.BatchNorm1d(12)))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    converted = convert_sync_batchnorm(model)
    names = {name: m.sync_name for name, m in converted.named_modules() if isinstance(m, SyncBatchNorm)}
    assert names == {"1": "1", "3.1": "3.1"}
    assert [converted.get_submodule(n).batchnorm1d for n in names] == [False, True]
    assert converted.state_dict().keys() == state.keys()
    assert all(torch.equal(converted.state_dict()[k], v) for k, v in state.items())


def test_keras_moments_are_keras_batchnormalizations_and_none_without_samples():
    keras = pytest.importorskip("keras")
    tf = pytest.importorskip("tensorflow")
    import horovod.tensorflow as hvd_tf

    from hvdazure.tensorflow.sync_batchnorm import SyncBatchNormalization

    hvd_tf.init()
    layer = SyncBatchNormalization(dtype="float64")
    layer.build((None, 5, 3))
    x = np.random.default_rng(0).normal(2.0, 3.0, size=(4, 5, 3))
    mean, variance = layer.synchronized_moments(tf.constant(x))
    np.testing.assert_allclose(mean.numpy(), x.mean(axis=(0, 1)), rtol=0, atol=1e-12)
    np.testing.assert_allclose(variance.numpy(), x.var(axis=(0, 1)), rtol=0, atol=1e-12)
    keras_mean, keras_variance = keras.layers.BatchNormalization._moments(layer, tf.constant(x), None)
    np.testing.assert_allclose(mean.numpy(), keras_mean.numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(variance.numpy(), keras_variance.numpy(), rtol=0, atol=1e-12)
    # no samples anywhere: the moving statistics, so that Keras's update leaves them as they are
    layer.moving_mean.assign([1.0, 2.0, 3.0])
    mean, variance = layer.synchronized_moments(tf.zeros((0, 5, 3), tf.float64))
    assert mean.numpy().tolist() == [1.0, 2.0, 3.0] and variance.numpy().tolist() == [1.0, 1.0, 1.0]


def test_keras_float32_moments_of_data_far_from_zero_are_as_accurate_as_tf_nn_moments():
    """Mean 1000, standard deviation 1, in float32: sums of squares would lose the variance to cancellation
    (Keras's own synchronized moments do); tf.nn.moments, the unsynchronized layer's, does not."""
    tf = pytest.importorskip("tensorflow")
    import horovod.tensorflow as hvd_tf

    from hvdazure.tensorflow.sync_batchnorm import SyncBatchNormalization

    hvd_tf.init()
    layer = SyncBatchNormalization(dtype="float32")
    layer.build((None, 4))
    x = np.random.default_rng(3).normal(1000.0, 1.0, size=(256, 4))
    _, variance = layer.synchronized_moments(tf.constant(x, tf.float32))
    _, reference = tf.nn.moments(tf.constant(x, tf.float32), axes=[0])

    np.testing.assert_allclose(variance.numpy(), x.var(axis=0), rtol=1e-3)
    np.testing.assert_allclose(reference.numpy(), x.var(axis=0), rtol=1e-3)
