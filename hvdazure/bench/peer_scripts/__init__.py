"""The scripts `hvdazure bench peers` launches, one per peer: each is what a user of that framework writes
to train the benchmark's model (models_torch.py, models_tf.py) data-parallel, started the way its users
start it (peers.py), plus a StepClock (peers_workload.py) that notes when each optimizer step ended. Run
as files (`torchrun ... ddp.py SPEC.json`), never imported by hvdazure itself."""
