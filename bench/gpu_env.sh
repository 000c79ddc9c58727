# Sourced on the GPU machine from the repository root (`source bench/gpu_env.sh; python3 -m ...`),
# with `.whl` and `.gpu-redis` carried (`make gpu-carry` here makes them; bench/README.md).
# Installs the carried wheels under /tmp/site, maps the fxcc package as pyproject's package-dir
# does (fxcc/ plus client, compiler_core, service, worker as its subpackages: a link to the
# repository alone would not), and puts the carried redis-server on PATH. Logs go under $OUT.
R=$(pwd)
mkdir -p /tmp/site "${OUT:-/tmp/out}"
pip install -q --no-deps --no-index --target /tmp/site .whl/*.whl >/tmp/pip.log 2>&1 || tail -5 /tmp/pip.log
rm -rf /tmp/site/fxcc && mkdir /tmp/site/fxcc
for f in "$R"/fxcc/*; do ln -s "$f" /tmp/site/fxcc/; done
for d in client compiler_core service worker; do ln -s "$R/$d" "/tmp/site/fxcc/$d"; done
export PYTHONPATH=/tmp/site:$R PYTHONSAFEPATH=1
export PATH=$R/.gpu-redis/usr/bin:$PATH
export LD_LIBRARY_PATH=$R/.gpu-redis/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
