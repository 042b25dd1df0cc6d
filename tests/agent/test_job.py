"""What the agent knows of the job's objects (profiler/agent/job.py JobObjects), alone: names, the
parameter count, the optimizer the step hook saw (held weakly), the roles of their tensors and the
first forward's input. CPU torch (tests/run.sh installs it)."""

from __future__ import annotations

import gc

import torch

from memq.agent.job import JobObjects

from .parts import guard


def test_names_given_as_strings_are_the_labels():
    j = JobObjects(model="Llama", optimizer="AdamW", guard=guard())
    assert (j.model_label(), j.optimizer_label()) == ("Llama", "AdamW")
    assert j.metadata() == {"optimizer": "AdamW", "model": "Llama"} and j.roles() is None


def test_objects_give_their_class_and_parameter_count():
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert JobObjects(model=model, optimizer=opt, guard=guard()).metadata() == \
        {"optimizer": "SGD", "params": 36, "model": "Linear"}
    assert JobObjects(optimizer=opt, guard=guard()).metadata() == {"optimizer": "SGD", "params": 36}


def test_the_hooks_optimizer_names_it_and_is_held_weakly():
    j = JobObjects(roles=True, role_devices=("cpu",), guard=guard())
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    j.saw_optimizer(opt)
    assert j.optimizer_label() == "SGD" and j.roles()["bytes"]["parameter"] == 36 * 4
    del opt, model
    gc.collect()
    assert j.roles() is None and j.optimizer_label() == "SGD"  # gone with the job's object, name kept


def test_a_given_optimizer_wins_over_the_hooks():
    j = JobObjects(optimizer="Adafactor", guard=guard())
    j.saw_optimizer(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1))
    assert j.optimizer_label() == "Adafactor" and j._hook_opt_ref is None


def test_roles_off_send_nothing():
    model = torch.nn.Linear(8, 4)
    assert JobObjects(model=model, roles=False, role_devices=("cpu",), guard=guard()).roles() is None
    assert JobObjects(model=model, roles=True, role_devices=("cpu",), guard=guard()).roles() is not None


def test_a_model_whose_parameters_fail_gives_what_it_can():
    class Odd:
        def parameters(self):
            raise RuntimeError("no")

    assert JobObjects(model=Odd(), optimizer="SGD", guard=guard()).metadata() == {"optimizer": "SGD"}


def test_the_first_forward_is_read_once_and_the_hook_goes():
    import torch.nn.modules.module as mm

    before = len(mm._global_forward_pre_hooks)
    j = JobObjects(guard=guard())
    j.install_input_hook()
    j.install_input_hook()  # once
    assert len(mm._global_forward_pre_hooks) == before + 1
    torch.nn.Linear(8, 4)(torch.zeros(3, 8))
    assert len(mm._global_forward_pre_hooks) == before and j.first_input["shapes"] == [[3, 8]]
    j.install_input_hook()  # seen: never again
    assert len(mm._global_forward_pre_hooks) == before
