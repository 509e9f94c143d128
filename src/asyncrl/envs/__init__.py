"""asyncrl.envs: environments, task sources, wrappers, the sandbox and the environment checker.

See docs/environments.md for the protocol, the built-in environments and how to write a plugin.
"""

from asyncrl.envs.base import (
    AnswerAction,
    Environment,
    EpisodeRewards,
    HashSplitTaskSource,
    MalformedAction,
    StepResult,
    SyncEnvironment,
    TaskSource,
    Tool,
    ToolCallAction,
    call_env,
    close_env,
    parse_action,
)
from asyncrl.envs.calculator import CalcError, CalculatorEnv, CalculatorTasks, evaluate
from asyncrl.envs.check import CheckReport, Finding, acheck_environment, check_environment
from asyncrl.envs.dataset_env import DatasetEnv, DatasetTasks, read_rows
from asyncrl.envs.kb_lookup import KBLookupEnv, KBTasks, KnowledgeBase
from asyncrl.envs.python_env import PythonEnv, PythonTasks
from asyncrl.envs.reasoning_gym_env import ReasoningGymEnv, ReasoningGymTasks
from asyncrl.envs.registry import (
    BUILTIN_ENVS,
    EnvPluginError,
    check_heldout,
    env_class,
    load_plugin,
    make_env,
    make_raw_env,
    make_task_source,
)
from asyncrl.envs.sandbox import SandboxLimits, SandboxResult, run_python, run_python_sync, sandbox_support
from asyncrl.envs.scoring import ScorerRefused, load_scorer
from asyncrl.envs.strings import StringsEnv, StringTasks
from asyncrl.envs.toolenv import EnvOptionsError, ToolEnv
from asyncrl.envs.wrappers import (
    EnvResetError,
    EnvWrapper,
    FaultWrapper,
    GuardedEnv,
    InjectedFault,
    LatencyWrapper,
)
from asyncrl.records import ToolCall  # the StepResult.tool_call field's type

__all__ = [
    "BUILTIN_ENVS",
    "AnswerAction",
    "CalcError",
    "CalculatorEnv",
    "CalculatorTasks",
    "CheckReport",
    "DatasetEnv",
    "DatasetTasks",
    "EnvOptionsError",
    "EnvPluginError",
    "EnvResetError",
    "EnvWrapper",
    "Environment",
    "EpisodeRewards",
    "FaultWrapper",
    "Finding",
    "GuardedEnv",
    "HashSplitTaskSource",
    "InjectedFault",
    "KBLookupEnv",
    "KBTasks",
    "KnowledgeBase",
    "LatencyWrapper",
    "MalformedAction",
    "PythonEnv",
    "PythonTasks",
    "ReasoningGymEnv",
    "ReasoningGymTasks",
    "SandboxLimits",
    "SandboxResult",
    "ScorerRefused",
    "StepResult",
    "StringTasks",
    "StringsEnv",
    "SyncEnvironment",
    "TaskSource",
    "Tool",
    "ToolCall",
    "ToolCallAction",
    "ToolEnv",
    "acheck_environment",
    "call_env",
    "check_environment",
    "check_heldout",
    "close_env",
    "env_class",
    "evaluate",
    "load_plugin",
    "load_scorer",
    "make_env",
    "make_raw_env",
    "make_task_source",
    "parse_action",
    "read_rows",
    "run_python",
    "run_python_sync",
    "sandbox_support",
]
