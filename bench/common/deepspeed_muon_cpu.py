"""DeepSpeed 0.19.8's Muon as deepspeed-cpp runs it on the CPU, for the peers that compare the
two (bench/common/deepspeed_train_gpt.py, tests/e2e/deepspeed_muon_interop.py): Newton-Schulz in
fp32 (DeepSpeed's CPU accelerator takes bf16 for "standard" and, where oneDNN has fp16, fp16 for
"gram"; deepspeed-cpp runs fp32 on the CPU), and the Adam half MuonWithAuxAdam's inline Adam
(FusedAdam is a JIT-compiled op on the CPU; the update is the same). TORCHDYNAMO_DISABLE keeps
torch.compile from compiling muon_update: it is read when original_muon is first imported, which
pin_muon() does.
"""
import os


def pin_muon(torch):
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.zero.muon import original_muon
    original_muon.ns_compute_dtype = lambda ns_method="gram": torch.float32
    configure = DeepSpeedEngine.get_optimizer_configuration

    def inline_adam(self, optimizer_parameters, adam_w_mode, allow_legacy_fallback=False):
        if allow_legacy_fallback:  # only Muon's Adam half asks with the fallback allowed
            optimizer_parameters.pop("torch_adam", None)
            return None, {}
        return configure(self, optimizer_parameters, adam_w_mode, allow_legacy_fallback)

    DeepSpeedEngine.get_optimizer_configuration = inline_adam
