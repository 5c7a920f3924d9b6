"""The sub-phase context managers of ``TrainingRecorder`` (a part of it): ``data_loading``, ``host_to_device``,
``forward``, ``backward``, ``optimizer_update``, ``zero_grad`` -- spans of the current iteration whose time goes into
the window's phase split (``_on_phase_end``, also for the user's own spans of those names) -- and the device timing
that times them on the device too: started at each loop start per the config (``_start_gpu_report``), its last
iterations' tail reported at the loop end (``_device_tail``)."""

from __future__ import annotations

from ..spans import Span
from .device_spans import DeviceSpan
from .names import PHASES, S
from .recorder_base import GROUP, RecorderBase, _mono

__all__ = ["PhaseSpans"]


class PhaseSpans(RecorderBase):
    """The phase context managers and device timing of ``TrainingRecorder``."""

    def _on_phase_end(self, s: Span) -> None:
        """A sub-phase span ended (ours or the user's own ``span("model_forward")``): into the window's split."""
        phase = PHASES.get(s.name)
        if phase is not None:
            self.phase = None
            phases = self._window.phases
            phases[phase] = phases.get(phase, 0.0) + s.duration_ns / 1e9

    def data_loading(self) -> Span:
        """A sub-phase of the current iteration (its time goes into the iteration split; timed on the device too
        while device timing is on)."""
        self.phase = (S.DATA_LOADING, _mono())
        if self._device is None or self._device.sampled_out:
            return self.tracer.span(S.DATA_LOADING, group=GROUP)
        return DeviceSpan(self.tracer, S.DATA_LOADING, GROUP, None)

    def host_to_device(self) -> Span:
        """Copying the batch to the device (phase ``h2d``; ours: one-logger has no such span). Timed on the device too:
        a ``non_blocking`` copy returns at once on the host, and its transfer would otherwise be in no phase."""
        self.phase = (S.HOST_TO_DEVICE, _mono())
        if self._device is None or self._device.sampled_out:
            return self.tracer.span(S.HOST_TO_DEVICE, group=GROUP)
        return DeviceSpan(self.tracer, S.HOST_TO_DEVICE, GROUP, None)

    def forward(self) -> Span:
        self.phase = (S.MODEL_FORWARD, _mono())
        if self._device is None or self._device.sampled_out:
            return self.tracer.span(S.MODEL_FORWARD, group=GROUP)
        return DeviceSpan(self.tracer, S.MODEL_FORWARD, GROUP, None)

    def backward(self) -> Span:
        self.phase = (S.MODEL_BACKWARD, _mono())
        if self._device is None or self._device.sampled_out:
            return self.tracer.span(S.MODEL_BACKWARD, group=GROUP)
        return DeviceSpan(self.tracer, S.MODEL_BACKWARD, GROUP, None)

    def optimizer_update(self) -> Span:
        self.phase = (S.OPTIMIZER_UPDATE, _mono())
        if self._device is None or self._device.sampled_out:
            return self.tracer.span(S.OPTIMIZER_UPDATE, group=GROUP)
        return DeviceSpan(self.tracer, S.OPTIMIZER_UPDATE, GROUP, None)

    def zero_grad(self) -> Span:
        self.phase = (S.ZERO_GRAD, _mono())
        if self._device is None or self._device.sampled_out:
            return self.tracer.span(S.ZERO_GRAD, group=GROUP)
        return DeviceSpan(self.tracer, S.ZERO_GRAD, GROUP, None)

    @property
    def device_timed(self) -> bool:
        """Whether this loop's iterations and phases are also timed on the device (``training.device_timing``)."""
        return self._device is not None

    def _device_tail(self) -> None:
        """The device times of the last iterations, when the loop ended right after a report (no final report to
        carry them): a ``device_timing`` event with ``tail`` true and the window's attributes (docs/training.md)."""
        attributes = self._gpu.tail()
        if attributes is not None:
            self.telemetry.event("device_timing", {"tail": True, **attributes}, group=GROUP)

    def _start_gpu_report(self) -> None:
        """At each loop start: device timing and GPU energy per the config, said in a ``device_timing`` event."""
        from .gpu_report import start_gpu_report

        config = self.config
        self._gpu, info = start_gpu_report(self.telemetry, config.device_timing if config else "auto",
                                           config.gpu_energy if config else True,
                                           config.device_timing_every if config else "auto",
                                           config.log_every_n_train_iterations if config else 50)
        self._device = self._gpu.timer if self._gpu is not None else None
        self.telemetry.event("device_timing", info, group=GROUP)
