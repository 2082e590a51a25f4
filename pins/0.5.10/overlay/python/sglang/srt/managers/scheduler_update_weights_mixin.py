from __future__ import annotations

import dataclasses
import logging
import traceback
from typing import TYPE_CHECKING, Tuple

import torch

from sglang.srt.constants import (
    GPU_MEMORY_ALL_TYPES,
    GPU_MEMORY_TYPE_CUDA_GRAPH,
    GPU_MEMORY_TYPE_KV_CACHE,
    GPU_MEMORY_TYPE_WEIGHTS,
)
from sglang.srt.managers.io_struct import (
    CheckWeightsReqInput,
    CheckWeightsReqOutput,
    DestroyWeightsUpdateGroupReqInput,
    DestroyWeightsUpdateGroupReqOutput,
    GetWeightsByNameReqInput,
    GetWeightsByNameReqOutput,
    InitWeightsUpdateGroupReqInput,
    InitWeightsUpdateGroupReqOutput,
    ReleaseMemoryOccupationReqInput,
    ReleaseMemoryOccupationReqOutput,
    ResumeMemoryOccupationReqInput,
    ResumeMemoryOccupationReqOutput,
    UpdateWeightFromDiskReqInput,
    UpdateWeightFromDiskReqOutput,
    UpdateWeightsFromDistributedReqInput,
    UpdateWeightsFromDistributedReqOutput,
    UpdateWeightsFromIPCReqInput,
    UpdateWeightsFromIPCReqOutput,
    UpdateWeightsFromTensorReqInput,
    UpdateWeightsFromTensorReqOutput,
)
from sglang.srt.managers.weight_op_results import (
    gather_from_tp_ranks,
    gather_rank_results,
)
from sglang.srt.managers.weight_update_health import (
    pause_watchdogs_during_weight_update,
)

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler

logger = logging.getLogger(__name__)


class SchedulerUpdateWeightsMixin:

    @pause_watchdogs_during_weight_update
    @gather_rank_results
    def update_weights_from_disk(
        self: Scheduler, recv_req: UpdateWeightFromDiskReqInput
    ):
        """In-place update of the weights from disk."""
        held = self.two_phase_session_holds_weights("a load from disk")
        if held:
            return UpdateWeightFromDiskReqOutput(False, held, 0)
        success, message = self.tp_worker.update_weights_from_disk(recv_req)
        if success:
            if recv_req.flush_cache:
                flush_cache_success = self.flush_cache()
                assert flush_cache_success, "Cache flush failed after updating weights"
        else:
            logger.error(message)
        return UpdateWeightFromDiskReqOutput(success, message, 0)

    @pause_watchdogs_during_weight_update
    @gather_rank_results
    def init_weights_update_group(
        self: Scheduler, recv_req: InitWeightsUpdateGroupReqInput
    ):
        """Initialize the online model parameter update group."""
        conflict = self.two_phase_session_conflict(
            recv_req.group_name, "initialising it again"
        )
        if conflict:
            return InitWeightsUpdateGroupReqOutput(False, conflict)
        if self.server_args.dp_size > 1 and not self.server_args.enable_dp_attention:
            # Every DP replica's TP ranks join: rank_offset + dp_rank * tp + tp_rank.
            recv_req = dataclasses.replace(
                recv_req, rank_offset=recv_req.rank_offset + self.dp_rank * self.tp_size
            )
        success, message = self.tp_worker.init_weights_update_group(recv_req)
        return InitWeightsUpdateGroupReqOutput(success, message)

    @gather_rank_results
    def destroy_weights_update_group(
        self: Scheduler, recv_req: DestroyWeightsUpdateGroupReqInput
    ):
        """Destroy the online model parameter update group."""
        fenced = self.two_phase_destroy_fence(recv_req.group_name, recv_req.session_id)
        if fenced:
            return DestroyWeightsUpdateGroupReqOutput(False, fenced)
        aborted = self.abort_two_phase_session_on_group(recv_req.group_name)
        success, message = self.tp_worker.destroy_weights_update_group(recv_req)
        if aborted:
            # An unusable group was already released by the abort.
            success, message = True, f"Destroyed the group; {aborted}."
        return DestroyWeightsUpdateGroupReqOutput(success, message)

    @pause_watchdogs_during_weight_update
    @gather_rank_results
    def update_weights_from_distributed(
        self,
        recv_req: UpdateWeightsFromDistributedReqInput,
    ) -> Tuple[bool, str]:
        """Update the online model parameter."""
        conflict = self.two_phase_session_conflict(
            recv_req.group_name, "another update on it"
        ) or self.two_phase_session_holds_weights("an update from a group")
        if conflict:
            return UpdateWeightsFromDistributedReqOutput(False, conflict)
        success, message = self.tp_worker.update_weights_from_distributed(recv_req)
        if success:
            if recv_req.flush_cache:
                flush_cache_success = self.flush_cache()
                assert flush_cache_success, "Cache flush failed after updating weights"
        else:
            logger.error(message)
        return UpdateWeightsFromDistributedReqOutput(success, message)

    @pause_watchdogs_during_weight_update
    @gather_rank_results
    def update_weights_from_tensor(
        self: Scheduler, recv_req: UpdateWeightsFromTensorReqInput
    ):
        """Update the online model parameter from tensors."""
        held = self.two_phase_session_holds_weights("an update from tensors")
        if held:
            return UpdateWeightsFromTensorReqOutput(False, held)
        if recv_req.disable_draft_model:
            worker = self.tp_worker
        else:
            worker = self.draft_worker or self.tp_worker
        success, message = worker.update_weights_from_tensor(recv_req)
        # TODO extract common code b/t update_weights_from_distributed and update_weights_from_tensor later
        if success:
            if recv_req.flush_cache:
                flush_cache_success = self.flush_cache()
                assert flush_cache_success, "Cache flush failed after updating weights"
        else:
            logger.error(message)
        torch.distributed.barrier(group=self.tp_cpu_group)
        return UpdateWeightsFromTensorReqOutput(success, message)

    @pause_watchdogs_during_weight_update
    @gather_rank_results
    def update_weights_from_ipc(
        self: Scheduler, recv_req: UpdateWeightsFromIPCReqInput
    ):
        """Update the online model parameter from IPC for checkpoint-engine integration."""
        held = self.two_phase_session_holds_weights("an update from IPC")
        if held:
            return UpdateWeightsFromIPCReqOutput(False, held)
        success, message = self.tp_worker.update_weights_from_ipc(recv_req)
        if success:
            if recv_req.flush_cache:
                flush_cache_success = self.flush_cache()
                assert flush_cache_success, "Cache flush failed after updating weights"
        else:
            logger.error(message)
        torch.distributed.barrier(group=self.tp_cpu_group)
        return UpdateWeightsFromIPCReqOutput(success, message)

    def get_weights_by_name(self: Scheduler, recv_req: GetWeightsByNameReqInput):
        parameter = self.tp_worker.get_weights_by_name(recv_req)
        return GetWeightsByNameReqOutput(parameter)

    def release_memory_occupation(
        self: Scheduler, recv_req: ReleaseMemoryOccupationReqInput
    ):
        from sglang.srt.managers.memory_occupation_checks import (
            agreed_refusal,
            memory_release_refusal,
        )

        refused = memory_release_refusal(
            recv_req.tags, self.offload_tags, self.is_fully_idle()
        )
        refused = agreed_refusal(refused, self.tp_cpu_group)
        if refused is not None:
            return ReleaseMemoryOccupationReqOutput(success=False, message=refused)
        assert (
            self.is_fully_idle()
        ), "release_memory_occupation should be called only when server is idle."

        tags = recv_req.tags

        if tags is None or len(tags) == 0:
            tags = GPU_MEMORY_ALL_TYPES

        self.two_phase_before_memory_release(GPU_MEMORY_TYPE_WEIGHTS in tags)

        for tag in tags:
            self.offload_tags.add(tag)

        if GPU_MEMORY_TYPE_KV_CACHE in tags:
            self.memory_saver_adapter.pause(GPU_MEMORY_TYPE_KV_CACHE)
            self.flush_cache()

        if GPU_MEMORY_TYPE_WEIGHTS in tags:
            self.stashed_model_static_state = _export_static_state(
                self.tp_worker.model_runner.model
            )
            torch.distributed.barrier(self.tp_cpu_group)
            self.memory_saver_adapter.pause(GPU_MEMORY_TYPE_WEIGHTS)

        if GPU_MEMORY_TYPE_CUDA_GRAPH in tags:
            self.memory_saver_adapter.pause(GPU_MEMORY_TYPE_CUDA_GRAPH)

        torch.get_device_module().synchronize()

        return ReleaseMemoryOccupationReqOutput()

    def resume_memory_occupation(
        self: Scheduler, recv_req: ResumeMemoryOccupationReqInput
    ):
        from sglang.srt.managers.memory_occupation_checks import memory_resume_refusal

        refused = memory_resume_refusal(recv_req.tags, self.offload_tags)
        if refused is not None:
            return ResumeMemoryOccupationReqOutput(success=False, message=refused)
        tags = recv_req.tags

        if tags is None or len(tags) == 0:
            tags = GPU_MEMORY_ALL_TYPES

        for tag in tags:
            self.offload_tags.remove(tag)

        if GPU_MEMORY_TYPE_CUDA_GRAPH in tags:
            self.memory_saver_adapter.resume(GPU_MEMORY_TYPE_CUDA_GRAPH)

        if GPU_MEMORY_TYPE_WEIGHTS in tags:
            self.memory_saver_adapter.resume(GPU_MEMORY_TYPE_WEIGHTS)
            torch.distributed.barrier(self.tp_cpu_group)
            _import_static_state(
                self.tp_worker.model_runner.model,
                self.stashed_model_static_state,
            )
            del self.stashed_model_static_state
            self.two_phase_weights_resumed()

        if GPU_MEMORY_TYPE_KV_CACHE in tags:
            self.memory_saver_adapter.resume(GPU_MEMORY_TYPE_KV_CACHE)

        return ResumeMemoryOccupationReqOutput()

    def check_weights(self: Scheduler, recv_req: CheckWeightsReqInput):
        try:
            extra = self.tp_worker.model_runner.check_weights(action=recv_req.action)
            local = {"success": True, "message": "Success.", **(extra or {})}
        except Exception as e:
            logger.warning(f"check_weights see error: {e}")
            traceback.print_exc()
            local = {"success": False, "message": f"{e}"}
        # Every TP rank ran the action; answer for all of them.
        rank_results = gather_from_tp_ranks(self, local)
        failed = [r for r in rank_results if not r["success"]]
        return CheckWeightsReqOutput(
            success=not failed,
            message=failed[0]["message"] if failed else "Success.",
            rank_results=rank_results,
        )

    def save_remote_model(self: Scheduler, params):
        url = params["url"]

        self.tp_worker.model_runner.save_remote_model(url)

        if self.draft_worker is not None:
            draft_url = params.get("draft_url", None)
            assert (
                draft_url is not None
            ), "draft_url must be provided when draft model is enabled"
            self.draft_worker.model_runner.save_remote_model(draft_url)

    def save_sharded_model(self: Scheduler, params):
        self.tp_worker.model_runner.save_sharded_model(
            path=params["path"],
            pattern=params["pattern"],
            max_size=params["max_size"],
        )


def _export_static_state(model):
    return dict(
        buffers=[
            (name, buffer.detach().clone()) for name, buffer in model.named_buffers()
        ]
    )


def _import_static_state(model, static_params):
    self_named_buffers = dict(model.named_buffers())
    for name, tensor in static_params["buffers"]:
        self_named_buffers[name][...] = tensor
