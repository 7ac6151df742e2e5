"""Deep Q-learning, in the shape of PyTorch's DQN tutorial, on a small pole-balancing
environment written here in plain Python (no gym).

Diff from the CUDA version (the lines changed, nothing else)::

    -    device = "cuda"
    +    device = "tpu"

What it exercises: an epsilon-greedy policy (``policy_net(state).max(1).indices.view(1, 1)``
under ``no_grad``, ``.item()`` of the action for the environment), a replay memory of
transitions holding device tensors (a ``deque`` sampled with ``random.sample``), batches built
with ``torch.cat`` and a boolean mask of non-final states made with ``torch.tensor(tuple(...),
dtype=torch.bool)``, ``gather(1, actions)``, ``next_values[mask] = target_net(...).max(1).values``,
``SmoothL1Loss``, ``clip_grad_value_``, ``AdamW(amsgrad=True)``, and the soft update of the
target network by iterating ``state_dict()`` items and ``load_state_dict``. ``main(device)`` runs
it and returns what tests/migration/test_scripts.py compares against the same script on CPU.

Run it alone: ``python -m tests.migration.dqn tpu``.
"""
from __future__ import annotations

import math
import random
import sys
from collections import deque, namedtuple

import torch
import torch.nn as nn

Transition = namedtuple("Transition", ("state", "action", "next_state", "reward"))
BATCH_SIZE, GAMMA, TAU, LR = 8, 0.99, 0.005, 1e-3
EPS_START, EPS_END, EPS_DECAY = 0.9, 0.05, 100


class Pole:
    """A cart and pole: two actions push left or right, reward 1 per step until it falls."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def reset(self):
        self.state = [self.rng.uniform(-0.05, 0.05) for _ in range(4)]
        return list(self.state)

    def step(self, action: int):
        x, x_dot, theta, theta_dot = self.state
        force = 10.0 if action == 1 else -10.0
        theta_acc = (9.8 * math.sin(theta) - math.cos(theta) * force * 0.05) / 0.6
        x_acc = force / 1.1 - 0.05 * theta_acc * math.cos(theta)
        x_dot, theta_dot = x_dot + 0.02 * x_acc, theta_dot + 0.02 * theta_acc
        x, theta = x + 0.02 * x_dot, theta + 0.02 * theta_dot
        self.state = [x, x_dot, theta, theta_dot]
        return list(self.state), 1.0, abs(x) > 2.4 or abs(theta) > 0.21


class ReplayMemory:
    def __init__(self, capacity, rng):
        self.memory = deque([], maxlen=capacity)
        self.rng = rng

    def push(self, *args):
        self.memory.append(Transition(*args))

    def sample(self, batch_size):
        return self.rng.sample(self.memory, batch_size)

    def __len__(self):
        return len(self.memory)


class DQN(nn.Module):
    def __init__(self, observations, actions, hidden=32):
        super().__init__()
        self.layer1 = nn.Linear(observations, hidden)
        self.layer2 = nn.Linear(hidden, hidden)
        self.layer3 = nn.Linear(hidden, actions)

    def forward(self, x):
        x = torch.relu(self.layer1(x))
        return self.layer3(torch.relu(self.layer2(x)))


def optimize_model(memory, policy_net, target_net, optimizer, device):
    if len(memory) < BATCH_SIZE:
        return None
    batch = Transition(*zip(*memory.sample(BATCH_SIZE)))
    non_final_mask = torch.tensor(tuple(s is not None for s in batch.next_state),
                                  device=device, dtype=torch.bool)
    non_final_next_states = torch.cat([s for s in batch.next_state if s is not None])
    state_batch = torch.cat(batch.state)
    action_batch = torch.cat(batch.action)
    reward_batch = torch.cat(batch.reward)

    state_action_values = policy_net(state_batch).gather(1, action_batch)
    next_state_values = torch.zeros(BATCH_SIZE, device=device)
    with torch.no_grad():
        next_state_values[non_final_mask] = target_net(non_final_next_states).max(1).values
    expected = next_state_values * GAMMA + reward_batch

    loss = nn.SmoothL1Loss()(state_action_values, expected.unsqueeze(1))
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_value_(policy_net.parameters(), 100)
    optimizer.step()
    return loss.item()


def main(device: str = "cuda", episodes: int = 3, max_steps: int = 20,
         compiled: bool = False) -> dict:
    torch.manual_seed(0)
    rng = random.Random(0)
    env = Pole(rng)
    policy_net = DQN(4, 2).to(device)
    target_net = DQN(4, 2).to(device)
    target_net.load_state_dict(policy_net.state_dict())
    optimizer = torch.optim.AdamW(policy_net.parameters(), lr=LR, amsgrad=True)
    if compiled:
        policy_net.compile(backend="torchtpu")
        target_net.compile(backend="torchtpu")
    memory = ReplayMemory(1000, rng)

    steps_done = 0
    losses, durations, actions = [], [], []
    for _ in range(episodes):
        state = torch.tensor(env.reset(), dtype=torch.float32, device=device).unsqueeze(0)
        duration = 0
        while duration < max_steps:
            duration += 1
            eps = EPS_END + (EPS_START - EPS_END) * math.exp(-steps_done / EPS_DECAY)
            steps_done += 1
            if rng.random() > eps:
                with torch.no_grad():
                    action = policy_net(state).max(1).indices.view(1, 1)
            else:
                action = torch.tensor([[rng.randrange(2)]], device=device, dtype=torch.long)
            actions.append(action.item())
            observation, reward, terminated = env.step(action.item())
            reward = torch.tensor([reward], device=device)
            next_state = None if terminated else torch.tensor(
                observation, dtype=torch.float32, device=device).unsqueeze(0)
            memory.push(state, action, next_state, reward)
            state = next_state

            loss = optimize_model(memory, policy_net, target_net, optimizer, device)
            if loss is not None:
                losses.append(loss)

            # Soft update of the target network: θ′ ← τ θ + (1 − τ) θ′
            target_state = target_net.state_dict()
            policy_state = policy_net.state_dict()
            for key in policy_state:
                target_state[key] = policy_state[key] * TAU + target_state[key] * (1 - TAU)
            target_net.load_state_dict(target_state)
            if terminated:
                break
        durations.append(duration)
    return {
        "losses": losses,
        "durations": durations,
        "actions": actions,
        "policy": {k: v.cpu() for k, v in policy_net.state_dict().items()},
        "target": {k: v.cpu() for k, v in target_net.state_dict().items()},
        "optimizer": [{k: v.cpu() for k, v in s.items()} for s in optimizer.state.values()],
    }


if __name__ == "__main__":
    result = main(*sys.argv[1:2])
    print(result["durations"], result["losses"][-3:])
