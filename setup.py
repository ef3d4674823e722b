"""Packaging for hvdazure. Exact versions for CI and the images live in versions.env and requirements/."""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent


def _version() -> str:
    for line in (ROOT / "hvdazure" / "_version.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip('"')
    raise RuntimeError("hvdazure/_version.py has no __version__")


setup(
    name="hvdazure",
    version=_version(),
    description="Horovod data-parallel training for PyTorch and TensorFlow, from a laptop to Azure ML",
    long_description=(ROOT / "README.md").read_text(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["hvdazure", "hvdazure.*"]),
    python_requires=">=3.10",
    # Horovod itself is not listed: PyPI has only an sdist that needs patching for current frameworks,
    # so scripts/build_horovod.sh builds it (see docs/getting-started.md, "What the first run builds").
    install_requires=[
        "pyyaml>=6", "numpy>=1.24", "tqdm>=4.60", "packaging>=21", "psutil>=5.9", "cloudpickle>=2",
        "fsspec>=2023.1",  # checkpoint storage (hvdazure/core/checkpoint/store.py), local paths included
        "xxhash>=3.0",  # checkpoint integrity: xxh3_128, ~25 GB/s where SHA-256 does ~1 (checkpoint/store.py)
    ],
    extras_require={
        "torch": ["torch>=2.1"],
        "tensorflow": ["tensorflow>=2.16", "keras>=3"],  # hvdazure.tensorflow imports Keras 3 itself
        # adlfs: checkpoints on abfs:// (Azure Blob / Data Lake) URLs, through fsspec. azure-ai-ml: submission
        # (hvdazure submit) builds on azure-ai-ml 1.35's entities and offline validation; pathspec reads
        # .amlignore / .gitignore for the code snapshot.
        "azure": ["azure-ai-ml>=1.35,<2", "azure-identity>=1.15", "pathspec>=0.11", "adlfs>=2023.10"],
        # the legacy SDK v1 path (hvdazure submit --sdk v1); azureml-core is out of support since 2026-06-30
        "azure-v1": ["azureml-core>=1.61", "azureml-train-core>=1.61", "azure-identity>=1.15",
                     "pathspec>=0.11"],  # azureml-train-core: HyperDriveConfig (hvdazure submit sweep)
        # hvdazure.data: Parquet shards (pyarrow); TFRecord framing checksums (CRC32C, google-crc32c)
        "data": ["pyarrow>=14", "google-crc32c>=1.5"],
        # hvdazure.torch.export to ONNX: torch.onnx's exporter, and onnxruntime to check the artifact
        "onnx": ["onnx>=1.17", "onnxscript>=0.5", "onnxruntime>=1.20"],
        "tensorboard": ["tensorboard>=2.14"],
        "mlflow": ["mlflow-skinny>=2.10", "sqlalchemy>=2", "alembic>=1.12"],
        # hvdazure sweep; mpi4py must be built from source against Horovod's MPI (scripts/setup_env.sh)
        "sweep": ["mpi4py>=4.1", "optuna>=4.0", "matplotlib>=3.7"],
        # hvdazure bench: plots; torchvision only for `--model resnet50`; the peers `hvdazure bench peers`
        # compares with (Lightning, HF Accelerate, and Keras 2 for MultiWorkerMirroredStrategy's fit)
        "bench": ["matplotlib>=3.7", "torchvision>=0.16", "lightning>=2.4", "accelerate>=1.0",
                  "tf-keras>=2.16"],
        "dev": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.5", "ruff>=0.5", "scikit-learn>=1.3",
                "responses>=0.25"],
    },
    entry_points={"console_scripts": ["hvdazure=hvdazure.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Operating System :: POSIX :: Linux",
    ],
)
