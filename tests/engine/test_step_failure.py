"""A scheduling bug that raises in the middle of a step, after its forward (the engine loop's recovery path,
``FaultIsolation.recover_from_step_failure``): the requests whose prefill was in that forward hold KV and sit in
no other queue yet; they still get one final output each (abort, 500, the reason), and the KV is free after."""

from __future__ import annotations

import pytest

from impl import Engine
from impl.checkpoint_factory.checkpoints import tiny_checkpoint
from impl.engine.output import SGLangDicts
from impl.engine.output_processor import OutputProcessor


@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "last-chunk"])
def test_requests_prefilled_in_a_failed_step_get_a_final_output(monkeypatch, chunked):
    extra = {"chunked_prefill_size": 16} if chunked else {}
    eng = Engine(model_path=tiny_checkpoint("e2b"), random_seed=0, **extra)
    try:
        sp = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
        reqs = eng.expand_requests([list(range(3, 27)), list(range(5, 17))], sp, False, -1, 0, None)
        handles = eng.submit(reqs, stream=True)
        sched = eng.scheduler
        if chunked:  # the first request's first chunk of 16; its last chunk goes into the failing step
            assert eng.step() and sched.chunked_req is not None
        orig = OutputProcessor.process

        def process(self, batch, logits):
            raise RuntimeError("a scheduling bug")

        monkeypatch.setattr(OutputProcessor, "process", process)
        with pytest.raises(RuntimeError, match="a scheduling bug"):
            eng.step()
        assert sched.queues.prefilling  # in flight: in no other queue
        monkeypatch.setattr(OutputProcessor, "process", orig)
        sched.recover_from_step_failure(RuntimeError("a scheduling bug"), 1)
        for _ in range(50):
            if not eng.step() and not sched.has_work:
                break
        eng._detokenizer.drain()
        finished = []
        for h in handles:
            dicts = SGLangDicts()
            outs = []
            while not h.queue.empty():
                outs.append(dicts.add(h.queue.get_nowait()))
            finished.append([o["meta_info"]["finish_reason"] for o in outs if o["meta_info"]["finish_reason"]])
        failed = [f for f in finished if f and f[0]["type"] == "abort"]
        assert failed, finished
        for f in finished:
            assert len(f) == 1, finished  # exactly one final output each
        for f in failed:
            assert f[0]["status_code"] == 500 and "internal error in the scheduler" in f[0]["message"]
        load = eng.load()
        assert load.kv_tokens_available == load.kv_tokens_total
        assert eng.health() is None
    finally:
        eng.shutdown()
