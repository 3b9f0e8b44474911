"""softtopk's lab: the ``softtopk`` command line (:mod:`softtopk_lab.cli`), its typed run configs
(:mod:`softtopk_lab.config`), the training tools, the built-in WordNet datasets and the sweeps behind
``docs/results.md``. Installed with the ``lab`` extra (numpy, tqdm, matplotlib); it imports only the
public names of :mod:`softtopk`, and the library never imports it."""
