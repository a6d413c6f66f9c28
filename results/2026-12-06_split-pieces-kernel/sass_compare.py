import sys, subprocess, re, hashlib, os
from concurrent.futures import ProcessPoolExecutor
cuobj = "/work/tools/triton/backends/nvidia/bin/cuobjdump"
def init(root):
    sys.path.insert(0, root)
    os.environ["HF_FLASHPATCH_CACHE"] = "/tmp/cmpcache_" + root.replace("/", "_")
def sass_of(args):
    root, idx = args
    import hf_flashpatch
    assert hf_flashpatch.__file__.startswith(root), (hf_flashpatch.__file__, root)
    from hf_flashpatch.kernels import forward
    from hf_flashpatch.kernels.build import compile_cubin
    b = forward.all_builds()[idx]
    cub = compile_cubin(b)[0]
    path = "/tmp/cmp_" + root.replace("/", "_") + f"_{idx}.cubin"
    open(path, "wb").write(cub)
    sass = subprocess.run([cuobj, "-sass", path], capture_output=True, text=True).stdout
    funcs = dict(re.findall(r"Function : (\w+)\n(.*?)(?=\n\s*Function : |\Z)", sass, re.S))
    return (b.source, b.defines), {k: hashlib.sha256(re.sub(r"/\*[0-9a-f]{4}\*/", "", v).encode()).hexdigest() for k, v in funcs.items()}
if __name__ == "__main__":
    old, new = sys.argv[1], sys.argv[2]
    sys.path.insert(0, new)
    from hf_flashpatch.kernels import forward
    n = len(forward.all_builds())
    import multiprocessing as mp
    with ProcessPoolExecutor(12, mp_context=mp.get_context("spawn"), initializer=init, initargs=(old,)) as ex:
        a = list(ex.map(sass_of, [(old, i) for i in range(n)]))
    with ProcessPoolExecutor(12, mp_context=mp.get_context("spawn"), initializer=init, initargs=(new,)) as ex:
        b = list(ex.map(sass_of, [(new, i) for i in range(n)]))
    diff = 0
    for (ka, fa), (kb, fb) in zip(a, b):
        assert ka == kb
        for name in fb:
            if fa.get(name) != fb[name]:
                diff += 1
                print("DIFF", dict(kb[1]), name, "new entry" if name not in fa else "")
    print(n, "builds,", diff, "differing functions")
