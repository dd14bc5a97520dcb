"""graphkernel.train, tested the way MindSpore's train tests are: Model.train/fit/eval/predict
over a dataset, the callbacks (LossMonitor's and TimeMonitor's printed lines, ModelCheckpoint's
.ckpt files, EarlyStopping, History) and the metrics against numpy."""
from __future__ import annotations

import os
import re
from typing import Any

import numpy as np
import pytest

import graphkernel as gk
import graphkernel.dataset as ds
from graphkernel import Tensor, nn
from graphkernel.errors import InputError, NoEffectWarning
from graphkernel.frontend import context
from graphkernel.train import (
    Accuracy,
    Callback,
    CheckpointConfig,
    EarlyStopping,
    History,
    Loss,
    LossMonitor,
    MetricError,
    Model,
    ModelCheckpoint,
    TimeMonitor,
    Top1CategoricalAccuracy,
    Top5CategoricalAccuracy,
    TrainingError,
)


@pytest.fixture(autouse=True)
def graph_mode() -> Any:
    context.set_context(mode=context.GRAPH_MODE, enable_graph_kernel=True)
    yield
    context.set_context(enable_graph_kernel=False)


def _blobs(n: int = 96, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Three separable clusters in 4 dimensions."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, n).astype(np.int32)
    centres = np.eye(3, 4, dtype=np.float32) * 4
    return centres[labels] + rng.normal(0, 0.5, (n, 4)).astype(np.float32), labels


def _model(metrics: Any = None) -> tuple[Model, nn.Cell]:
    gk.set_seed(0)
    net = nn.Dense(4, 3)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    return Model(net, loss_fn=loss, optimizer=opt, metrics=metrics), net


def _dataset(shuffle: bool = False, batch: int = 16) -> ds.Dataset:
    x, y = _blobs()
    return ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=shuffle).batch(batch)


def test_model_train_steps_match_train_one_step_cell(capsys):
    """
    Feature: Model.train
    Description: train 2 epochs through Model with LossMonitor; the same steps by hand with
        TrainOneStepCell from the same initialisation
    Expectation: the printed losses are the hand-run step's losses; MindSpore's line format
    """
    model, net = _model()
    model.train(2, _dataset(), callbacks=[LossMonitor()])
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 12
    assert re.fullmatch(r"epoch: 1 step: 1, loss is \d+\.\d+", printed[0]), printed[0]
    assert printed[11].startswith("epoch: 2 step: 6, loss is ")
    by_model = [float(line.rsplit(" ", 1)[1]) for line in printed]

    gk.set_seed(0)
    net2 = nn.Dense(4, 3)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    step = nn.TrainOneStepCell(nn.WithLossCell(net2, loss), nn.Momentum(
        net2.trainable_params(), learning_rate=0.1, momentum=0.9))
    x, y = _blobs()
    by_hand = [float(step(Tensor(x[i:i + 16]), Tensor(y[i:i + 16])).asnumpy())
               for _ in range(2) for i in range(0, 96, 16)]
    np.testing.assert_allclose(by_model, by_hand, rtol=1e-6)
    np.testing.assert_allclose(net.weight.asnumpy(), net2.weight.asnumpy(), rtol=1e-6)


def test_model_eval_and_predict_against_numpy():
    """
    Feature: Model.eval, Model.predict, metrics
    Description: evaluate with accuracy, loss and top-1/top-5 on a dataset whose last batch is
        short
    Expectation: the values numpy computes from predict's logits
    """
    model, net = _model(metrics={"accuracy", "loss", "top_1_accuracy"})
    model.train(3, _dataset(shuffle=True))
    x, y = _blobs(50, seed=1)
    result = model.eval(ds.NumpySlicesDataset((x, y), shuffle=False).batch(16))
    logits = model.predict(Tensor(x)).asnumpy()
    accuracy = float((logits.argmax(1) == y).mean())
    assert set(result) == {"accuracy", "loss", "top_1_accuracy"}
    assert result["accuracy"] == pytest.approx(accuracy)
    assert result["top_1_accuracy"] == pytest.approx(accuracy)
    assert result["accuracy"] > 0.9
    shifted = logits - logits.max(1, keepdims=True)
    per_sample = np.log(np.exp(shifted).sum(1)) - shifted[np.arange(50), y]
    batch_means = [per_sample[i:i + 16].mean() for i in range(0, 50, 16)]
    assert result["loss"] == pytest.approx(np.mean(batch_means), rel=1e-4, abs=1e-7)


def test_metrics_accuracy_topk_loss():
    """
    Feature: Accuracy, Top1/Top5CategoricalAccuracy, Loss
    Description: update with logits and index or one-hot labels, then eval; eval before update
    Expectation: the fractions by hand; a MetricError before any update
    """
    y_pred = np.array([[0.1, 0.2, 0.7, 0, 0, 0], [0.5, 0.1, 0.4, 0, 0, 0],
                       [0.1, 0.8, 0.1, 0, 0, 0]], np.float32)
    y = np.array([2, 2, 0])
    acc = Accuracy()
    acc.update(Tensor(y_pred), Tensor(y))
    assert acc.eval() == pytest.approx(1 / 3)
    acc.clear()
    acc.update(y_pred, np.eye(6)[y])  # one-hot labels
    assert acc.eval() == pytest.approx(1 / 3)
    top1, top5 = Top1CategoricalAccuracy(), Top5CategoricalAccuracy()
    for metric in (top1, top5):
        metric.update(y_pred, y)
    assert top1.eval() == pytest.approx(1 / 3)
    assert top5.eval() == pytest.approx(1.0)
    loss = Loss()
    loss.update(Tensor(np.float32(2.0)))
    loss.update(np.array([1.0, 3.0]))
    assert loss.eval() == pytest.approx(2.0)
    with pytest.raises(MetricError, match="number of samples is 0"):
        Accuracy().eval()
    with pytest.raises(InputError, match="does not label y_pred"):
        acc.update(y_pred, np.array([1, 2]))
    with pytest.raises(InputError, match="unknown metric 'f1'"):
        Model(nn.Dense(4, 3), nn.MSELoss(), metrics={"f1"})


def test_model_checkpoint_writes_ckpt_files_that_load_back(tmp_path):
    """
    Feature: ModelCheckpoint, CheckpointConfig
    Description: save every 4 steps keeping 2 files over 2 epochs of 6 steps, then a second
        run with the same prefix in the same directory
    Expectation: MindSpore's names, the oldest removed, one more at the end of training, the
        newest file loads into a fresh net as the trained weights; the second run's prefix
        becomes CKP_1
    """
    model, net = _model()
    config = CheckpointConfig(save_checkpoint_steps=4, keep_checkpoint_max=2)
    checkpoint = ModelCheckpoint(prefix="CKP", directory=str(tmp_path), config=config)
    model.train(2, _dataset(), callbacks=checkpoint)
    # steps 4, 8 (epoch 2 step 2), and the last step 12 (epoch 2 step 6) at the end
    assert sorted(os.listdir(tmp_path)) == ["CKP-2_2.ckpt", "CKP-2_6.ckpt"]
    assert checkpoint.latest_ckpt_file_name == str(tmp_path / "CKP-2_6.ckpt")
    params = gk.load_checkpoint(str(tmp_path / "CKP-2_6.ckpt"))
    # MindSpore's names: the network's own, and the optimizer's state under "moments."
    assert sorted(params) == ["bias", "moments.bias", "moments.weight", "weight"]
    np.testing.assert_array_equal(params["weight"].asnumpy(), net.weight.asnumpy())
    fresh = nn.Dense(4, 3)
    gk.load_param_into_net(fresh, params)
    np.testing.assert_array_equal(fresh.bias.asnumpy(), net.bias.asnumpy())
    again, _ = _model()
    again.train(1, _dataset(), callbacks=ModelCheckpoint("CKP", str(tmp_path),
                                                         CheckpointConfig(6)))
    assert "CKP_1-1_6.ckpt" in os.listdir(tmp_path)
    # A prefix with a dash is matched whole: "my-net" is taken by its own files only.
    for prefix, expected in [("my-net", "my-net-1_6.ckpt"), ("my-net", "my-net_1-1_6.ckpt"),
                             ("my", "my-1_6.ckpt")]:
        again.train(1, _dataset(), callbacks=ModelCheckpoint(prefix, str(tmp_path),
                                                             CheckpointConfig(6)))
        assert expected in os.listdir(tmp_path)
    with pytest.raises(InputError, match="can't both be 0"):
        CheckpointConfig(save_checkpoint_steps=0)


def test_early_stopping_history_and_fit():
    """
    Feature: EarlyStopping, History, Model.fit
    Description: fit with a validation set, EarlyStopping on accuracy with patience 1 and
        restore_best_weights, and a callback that freezes the metric from epoch 2 on (no
        improvement); History records
    Expectation: training stops at epoch 2 with epoch 1's weights back; History holds the
        epochs and the eval metrics; the eval results (with eval_loss) are in cb_params
    """
    model, net = _model(metrics={"accuracy"})
    seen: list[dict[str, float]] = []
    after_first: list[np.ndarray] = []

    class Freeze(Callback):
        def on_train_epoch_end(self, run_context):
            params = run_context.original_args()
            seen.append(dict(params.eval_results))
            if params.cur_epoch_num == 1:
                after_first.append(net.weight.asnumpy().copy())
            else:
                params.eval_results["accuracy"] = 0.0  # no improvement from here on

    history = History()
    stopper = EarlyStopping(monitor="accuracy", patience=1, restore_best_weights=True)
    model.fit(10, _dataset(), valid_dataset=_dataset(), callbacks=[Freeze(), stopper, history])
    assert history.epoch == {"epoch": [1, 2]}
    assert stopper.stopped_epoch == 2
    np.testing.assert_array_equal(net.weight.asnumpy(), after_first[0])
    assert set(seen[0]) == {"accuracy", "eval_loss"}
    assert len(history.history["net_output"]) == 2
    assert history.history["accuracy"] == [s["accuracy"] for s in seen]


def test_early_stopping_on_training_loss():
    """
    Feature: EarlyStopping(monitor="loss")
    Description: a learning rate of 0 keeps the loss flat, so no epoch improves on the first
    Expectation: stops after patience + 1 epochs
    """
    gk.set_seed(0)
    net = nn.Dense(4, 3)
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.SGD(net.trainable_params(), learning_rate=0.0))
    history = History()
    stopper = EarlyStopping(monitor="loss", patience=2)
    model.train(10, _dataset(), callbacks=[stopper, history])
    assert history.epoch["epoch"] == [1, 2, 3]


def test_time_monitor_prints_mindspore_line(capsys):
    """
    Feature: TimeMonitor
    Description: one epoch of 6 steps
    Expectation: "epoch time: X ms, per step time: Y ms" with Y = X / 6
    """
    model, _ = _model()
    model.train(1, _dataset(), callbacks=[TimeMonitor()])
    line = capsys.readouterr().out.strip()
    match = re.fullmatch(r"epoch time: (\d+\.\d{3}) ms, per step time: (\d+\.\d{3}) ms", line)
    assert match, line
    assert float(match.group(2)) == pytest.approx(float(match.group(1)) / 6, abs=1e-3)


def test_model_arguments_are_checked():
    """
    Feature: Model's argument checks
    Description: not a dataset, a dataset repeated forever, eval without metrics, sink mode
    Expectation: InputErrors naming the problem; sink mode a NoEffectWarning at the caller
    """
    model, _ = _model()
    x, y = _blobs()
    with pytest.raises(InputError, match="must be a graphkernel.dataset Dataset"):
        model.train(1, [(x, y)])
    with pytest.raises(InputError, match="repeats forever"):
        model.train(1, _dataset().repeat())
    with pytest.raises(InputError, match="Model.eval needs metrics"):
        model.eval(_dataset())
    with pytest.raises(InputError, match="callbacks must be Callback instances"):
        model.train(1, _dataset(), callbacks=[print])
    with pytest.warns(NoEffectWarning, match="dataset_sink_mode=True has no effect") as record:
        model.train(1, _dataset(), dataset_sink_mode=True)
    assert record[0].filename == __file__


def test_loss_monitor_stops_on_a_nan_loss_and_predict_keeps_the_mode():
    """
    Feature: LossMonitor's check, Model.predict
    Description: a NaN pixel in the second batch; predict on a net in train and eval mode
    Expectation: a TrainingError (a ValueError) naming the epoch and step, as MindSpore's;
        predict leaves the network's mode as it found it
    """
    model, net = _model()
    x, y = _blobs()
    x[20, 1] = np.nan
    data = ds.NumpySlicesDataset((x, y), shuffle=False).batch(16)
    with pytest.raises(TrainingError, match=r"epoch: 1 step: 2\. Invalid loss nan"):
        model.train(3, data, callbacks=LossMonitor(per_print_times=0))
    net.set_train(True)
    model.predict(Tensor(_blobs(4)[0]))
    assert net.training
    net.set_train(False)
    model.predict(Tensor(_blobs(4)[0]))
    assert not net.training


def test_eval_network_with_and_without_eval_indexes():
    """
    Feature: Model(eval_network=..., eval_indexes=...)
    Description: an evaluation network returning (logits, label) with no eval_indexes, and one
        returning (label, loss, logits) with eval_indexes [1, 2, 0]
    Expectation: as MindSpore's: without indexes each metric gets all the outputs; with them,
        Loss gets the loss and Accuracy (logits, label); both agree with the default
        WithEvalCell
    """
    model, net = _model(metrics={"accuracy", "loss"})
    model.train(2, _dataset())
    expected = model.eval(_dataset())

    class Plain(nn.Cell):
        def __init__(self, backbone):
            super().__init__(auto_prefix=False)
            self.backbone = backbone

        def construct(self, x, label):
            return self.backbone(x), label

    class Shuffled(nn.Cell):
        def __init__(self, backbone, loss_fn):
            super().__init__(auto_prefix=False)
            self.backbone, self.loss_fn = backbone, loss_fn

        def construct(self, x, label):
            logits = self.backbone(x)
            return label, self.loss_fn(logits, label), logits

    plain = Model(net, eval_network=Plain(net), metrics={"acc": Accuracy()})
    assert plain.eval(_dataset()) == {"acc": expected["accuracy"]}
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    indexed = Model(net, eval_network=Shuffled(net, loss), eval_indexes=[1, 2, 0],
                    metrics={"accuracy", "loss"})
    result = indexed.eval(_dataset())
    assert result["accuracy"] == expected["accuracy"]
    assert result["loss"] == pytest.approx(expected["loss"], rel=1e-6)
