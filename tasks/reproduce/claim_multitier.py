"""Claim: in multi-tier FL (each client trains at a fixed exit, its tier) the Accumulator is at
least as accurate as layer-wise linear heads at every exit (seed 001 Table 3, Fig. 3 bottom).

The experiment also personalizes its final models on each client's corrupted data (seed 001
Table 4 starts from "the pre-trained multi-tier model"): the ``personalize`` claim reads it.
"""

from __future__ import annotations

from functools import partial

from tasks.reproduce import claim_anytime
from tasks.reproduce.spec import Claim, Dropped, Experiment

# Seed 001 §5.1, App. A "Multi-tier based Federated Learning": FedAvg, SGD lr 5e-3 (no
# momentum given), batch 10, 1 local epoch, 100 clients with 10% per round, LDA Dir(1.0)
# (Table 3's "Non-IID (1.0)"), every client with a permanent exit, tiers balanced over the
# clients, 1500 rounds, cosine lr schedule (fedapt has none: constant). DeiT-small's ImageNet
# weights and CIFAR-100 are not available offline: a ViT of DeiT-S's shape (12 blocks, 384
# wide, 6 heads; 4-pixel patches on 28x28 FashionMNIST) pretrained by fedapt's pretrain stage
# on FashionMNIST rows the federation never sees stands in, so that, as in the seed, its CLS
# token is trained (seed 001 Table 5: the pretrained CLS behind the Accumulator's "parallel
# connection" drives most of its gain). The base learns classes 5-9 only (out of domain, as
# ImageNet is for CIFAR-100): with a base of all ten classes the linear heads read the task
# about as well at every exit (claim_anytime.IN_DOMAIN), so the run lacked the claim's driver.
TIERS = "[0,1,2,3,4,5,6,7,8,9,10,11]"
SEED001_MULTITIER = (
    "data.dataset=fashion_mnist",
    "data.train_subset=50000",  # the other 10,000 training rows train the base
    "data.test_subset=null",
    "partition.scheme=dirichlet_classwise",
    "partition.dirichlet_classwise.beta=1.0",
    "partition.num_clients=100",
    "model.name=vit_small",
    "model.options.patch_size=4",
    "model.options.depth=12",
    "model.options.embed_dim=384",
    "model.input_size=28",
    "model.base=pretrain",
    "pretrain.dataset=null",
    "pretrain.classes=[5,6,7,8,9]",
    "pretrain.max_samples=10000",
    "pretrain.epochs=10",
    "federation.rounds=1500",
    "federation.participation=0.1",
    "federation.sampling=without_replacement",
    "federation.eval_every=10",
    "client.optimizer=sgd",
    "client.lr=0.005",
    "client.momentum=0.0",
    "client.weight_decay=0.0",
    "client.local_epochs=1",
    "client.batch_size=10",
    "client.max_steps=null",
    "lr_schedule.kind=constant",
    "grid.algorithms=[fedavg]",
    "grid.adapters=[lw_linear,accumulator]",
    "grid.adapter_options.lw_linear.exits=multitier",
    f"grid.adapter_options.lw_linear.tiers={TIERS}",
    "grid.adapter_options.accumulator.exits=multitier",
    f"grid.adapter_options.accumulator.tiers={TIERS}",
    # Table 4 (the personalize claim): each client fine-tunes the final model for 10 local
    # epochs on its own data, corrupted with a severity of its own, at its tier's exit, and
    # is tested on held-out data of its own. Severities 1-5 (5 values, coprime with the
    # tiers' count, so tier and severity vary independently over the clients).
    "personalize.enabled=true",
    "personalize.scopes=[payload,client_token]",
    "personalize.epochs=10",
    "personalize.lr=0.005",
    "personalize.batch_size=10",
    "personalize.severities=[1,2,3,4,5]",
    "personalize.tune_fraction=0.5",
    "personalize.max_clients=null",
)
CPU_TIERS = "[0,1,2,3,4,5]"
EXITS = Experiment(
    "multitier-exits",
    protocol=SEED001_MULTITIER,
    scale={
        "cpu": (
            "model.options.patch_size=14",
            "model.options.depth=6",
            "model.options.embed_dim=128",
            "data.train_subset=6000",
            "data.test_subset=1000",
            "pretrain.max_samples=10000",
            "pretrain.epochs=4",
            f"grid.adapter_options.lw_linear.tiers={CPU_TIERS}",
            f"grid.adapter_options.accumulator.tiers={CPU_TIERS}",
            "federation.rounds=150",
            "federation.eval_every=3",
            "client.lr=0.05",
            "personalize.lr=0.05",
            "personalize.max_clients=30",
        ),
        "ci": (
            "model.options.patch_size=7",
            "model.options.depth=2",
            "model.options.embed_dim=64",
            "data.train_subset=80",
            "data.test_subset=40",
            "partition.num_clients=4",
            "partition.dirichlet_classwise.min_size=2",
            "pretrain.max_samples=64",
            "pretrain.epochs=1",
            "grid.adapter_options.lw_linear.tiers=[0,1]",
            "grid.adapter_options.accumulator.tiers=[0,1]",
            "federation.participation=0.5",
            "federation.rounds=2",
            "federation.eval_every=1",
            "client.max_steps=2",
            "personalize.epochs=1",
            "personalize.max_clients=2",
        ),
    },
)

IN_DOMAIN = Dropped(
    design="base pretrained on all ten FashionMNIST classes (10,000 held-out rows, 4 epochs; "
    "81.3% on the test rows with seed 0), 60 rounds, 1,000 test images every 5 rounds",
    measured="read by this rule (means of the last 10 evaluations): headroom 1.18, 1.60, 0.15 "
    "points over seeds 0-2; each method's last exit 0.3-8.8 points below the base; the "
    "Accumulator ahead of the linear heads at every exit by 1.0-10.2 points",
    why="the linear exits were saturated and neither method ended above the base: the run "
    "could not test the claim's driver, so the Accumulator's lead says nothing about it",
)


CLAIM = Claim(
    id="multitier",
    title="In multi-tier FL (each client trains at its own fixed exit) the Accumulator is at "
    "least as accurate as layer-wise linear heads at every exit.",
    source="seed 001 Table 3, Fig. 3 (bottom), Appendix A",
    paper=(
        "Table 3 (multi-tier FL, DeiT-small, 12 tiers): CIFAR-100 Non-IID (1.0) L.W. Linear "
        "30.98 ± 0.60 vs Accumulator 57.32 ± 0.88; IID 32.43 vs 58.27; Non-IID (0.1) 21.33 vs "
        "47.26; FEMNIST non-IID 35.17 vs 71.33 (L.W. MLP 24.37-36.57). Fig. 3 (bottom) shows "
        "the Accumulator above the layer-wise heads for the clients of every tier."
    ),
    experiments=(EXITS,),
    measure=partial(claim_anytime.measure, experiment=EXITS.name),
    rule=claim_anytime.RULE,
    tolerance="Seed 001's Table 3 stds are 0.3-1.4 points per method against gaps of 26-36 "
    "points, so the claim is about the direction: 2 points (about one such std of the two "
    "methods' difference) count as level, and the seed-to-seed spread of each paired "
    "difference is the interval's (a 10-evaluation mean instead of one evaluation). The "
    "headroom guard measures the driver, as in the anytime claim: Table 3's linear heads "
    "average 30.98% over the 12 exits, about 43 points below a linear head at the last exit "
    "(73.85%, Table 1); 5 points (2.5 tolerances) is a floor far under that and above the "
    "0.2-1.6 points of the cpu records with an in-domain base.",
    plot=partial(claim_anytime.plot, experiment=EXITS.name),
    scaled={
        "gpu": "The seed's protocol (1,500 rounds, 100 Dir(1.0) clients, 10% per round, SGD "
        "5e-3, batch 10, 12 tiers) on 50,000 FashionMNIST images, with a ViT of DeiT-small's "
        "shape (12 blocks, 384 wide, 4-pixel patches at 28x28) pretrained by the pretrain "
        "stage on the other 10,000 rows' classes 5-9 (10 epochs; out of domain, as ImageNet "
        "is for CIFAR-100, so that the linear exits do not saturate): CIFAR-100 and DeiT's "
        "ImageNet weights are not available offline; a constant lr instead of the cosine "
        "schedule.",
        "cpu": "A ViT of 6 blocks, 128 wide (2 heads of 64), 14-pixel patches (4 tokens and "
        "the CLS), its CLS trained by the pretrain stage on 10,000 held-out FashionMNIST rows "
        "of classes 5-9 only (4 epochs; out of domain: a base of all ten classes left the "
        "linear heads within 2 points of their last exit at every depth, see the sensitivity "
        "row): the pretrained CLS is what the seed's "
        "ablation (Table 5) credits with most of the Accumulator's gain, and MiniLM's untrained "
        "CLS (the anytime claim) lacks it. DeiT-S's width 384 costs about 4x per step, and "
        "7-pixel patches 3x: with them the base got to 61-72% in the same CPU time (probes "
        "of 2026-11-26). 6 tiers (one per block), 6,000 images over 100 Dir(1.0) clients, 10 "
        "per round, 150 rounds at lr 0.05 (10x the seed's: 150 rounds are a tenth of its "
        "rounds), 1,000 test images every 3 rounds; personalization on "
        "the first 30 clients (each tier x severity pair once) at the same lr.",
        "ci": "Smoke test: a 2-block, 64-wide ViT; 80 images over 4 clients, 2 rounds of 2 "
        "steps, 2 tiers.",
    },
    thresholds=claim_anytime.THRESHOLDS,
    window=claim_anytime.WINDOW,
    dropped=(IN_DOMAIN,),
)
