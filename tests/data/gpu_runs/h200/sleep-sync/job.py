
import ctypes, datetime, os, sys, time

mode = sys.argv[1]
if mode == "sleep-sync":
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    assert cuda.cuDevicePrimaryCtxSetFlags(0, 4) == 0  # CU_CTX_SCHED_BLOCKING_SYNC, before torch makes the context
import torch
import torch.distributed as dist

dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=20))
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
torch.manual_seed(0)
w = torch.randn(1024, 1024, device="cuda")
x = torch.randn(256, 1024, device="cuda")
torch.cuda._sleep(1000)  # every kernel used below launched once first (lazy loading would hold a first launch)
torch.cuda.synchronize()
for step in range(1, 100_000):
    loss = (x @ w).tanh().square().mean()
    dist.all_reduce(loss)
    if step == 8:
        if mode in ("collective-timeout", "barrier", "sleep-sync"):
            print("the GPU wedges now (a kernel that does not end)", flush=True)
            torch.cuda._sleep(10 ** 12)  # minutes of GPU time in one kernel
            if mode == "barrier":
                dist.barrier()  # WAIT barrier
            else:
                dist.all_reduce(loss)  # WAIT collective
        elif mode == "oom":
            big = torch.empty(1 << 44, dtype=torch.uint8, device="cuda")  # WAIT oom: 16 TiB
        elif mode == "device-assert":
            index = torch.tensor([5000], device="cuda")
            picked = x[index]  # WAIT assert: row 5000 of 256
            torch.cuda.synchronize()
    value = loss.item()  # WAIT item
    print(f"step {step} loss {value:.4f}", flush=True)
    time.sleep(0.25)
dist.destroy_process_group()
