"""Bad input, round three, part 5 (issue 31): the new cases, tried as a new user would across every entry point,
kept as one table. Each row: an id, what the case did before this round's fixes (``clean``: refused in one line;
``traceback``; ``silent``: nonsense accepted, exit 0; ``lost``: work deleted or overwritten; ``legal``: legal input,
handled), the command, and what it must do now: ``2:<regex>`` (exit 2, one line ``error: ...`` matching) or
``0:<why it is accepted>`` (exit 0). Every command runs in this process through the verb's ``main``; the ones
refused stop before any training, so the table costs seconds. Totals are in :data:`BEFORE` (computed from the
table) and in the issue's closing note."""
import collections
import json
import shlex
import shutil

import pytest

transformers = pytest.importorskip("transformers")

T = ("model.d_model=16 model.n_heads=2 model.n_layers=1 model.max_len=32 data.block_size=32 data.batch_size=4 "
     "data.max_chars=20000 trainer.max_steps=2 trainer.val_check_interval=2 trainer.limit_val_batches=2 "
     "sample=false callbacks.progress=none")
ED = ("model=encoder_decoder model.d_model=16 model.n_heads=2 model.n_layers=1 model.max_len=32 data.batch_size=4 "
      "trainer.max_steps=2 trainer.val_check_interval=2 trainer.limit_val_batches=2 sample=false "
      "callbacks.progress=none")
CL = ("model=encoder_only task=classify model.d_model=16 model.n_heads=2 model.n_layers=1 model.max_len=32 "
      "data.max_len=32 data.batch_size=4 trainer.max_steps=2 trainer.val_check_interval=2 trainer.limit_val_batches=2 "
      "sample=false callbacks.progress=none")
PA = ("model=encoder_decoder data=parallel model.d_model=16 model.n_heads=2 model.n_layers=1 model.max_len=32 "
      "data.max_len=16 data.batch_size=4 trainer.max_steps=2 trainer.val_check_interval=2 trainer.limit_val_batches=2 "
      "sample=false callbacks.progress=none")
RUN = "hydra.run.dir={out}"
SWEEP = "hydra.sweep.dir={out}"

CASES = [
    # -- train: model, optimiser and trainer values
    ("t01", "clean", f"train {T} model.d_model=abc {RUN}", "2:model.d_model=abc.*Integer"),
    ("t02", "clean", f"train {T} model.d_model=0 {RUN}", "2:model.d_model=0: must be >= 1"),
    ("t03", "clean", f"train {T} model.d_model=-16 {RUN}", "2:model.d_model=-16: must be >= 1"),
    ("t04", "clean", f"train {T} model.d_model=15 {RUN}", "2:must be divisible by model.n_heads=2"),
    ("t05", "clean", f"train {T} model.d_model=16.5 {RUN}", "2:model.d_model=16.5.*Integer"),
    ("t06", "clean", f"train {T} optim.lr=nan {RUN}", "2:optim.lr=nan"),
    ("t07", "silent", f"train {T} optim.lr=inf {RUN}", "2:optim.lr=inf: must be a finite number"),
    ("t08", "clean", f"train {T} optim.lr=-0.001 {RUN}", "2:optim.lr=-0.001: must be > 0"),
    ("t09", "clean", f"train {T} optim.lr=0 {RUN}", "2:optim.lr=0.0: must be > 0"),
    ("t10", "clean", f"train {T} optim.lr=[0.1,0.2] {RUN}", "2:optim.lr=\\[0.1,0.2\\].*Float"),
    ("t11", "clean", f"train {T} optim.betas=[0.9] {RUN}", "2:optim.betas=\\[0.9\\]: two numbers"),
    ("t12", "clean", f"train {T} optim.betas=[1.5,0.99] {RUN}", "2:optim.betas=.*two numbers in \\[0, 1\\)"),
    ("t13", "clean", f"train {T} seed=-1 {RUN}", "2:seed=-1: seed must be in"),
    ("t14", "clean", f"train {T} seed=99999999999999999999999 {RUN}", "2:seed must be in"),
    ("t15", "clean", f"train {T} seed= {RUN}", "2:seed must be an integer"),
    ("t16", "clean", f"train {T} trainer.max_steps=-5 {RUN}", "2:trainer.max_steps=-5"),
    ("t17", "clean", f"train {T} trainer.max_steps=1e9 {RUN}", "2:trainer.max_steps=1000000000.0"),
    ("t18", "clean", f"train {T} model.dropout=1.5 {RUN}", "2:model.dropout=1.5: must be in \\[0, 1\\)"),
    ("t19", "clean", f"train {T} model.dropout=nan {RUN}", "2:model.dropout=nan"),
    ("t20", "clean", f"train {T} divergence_patience=0 {RUN}", "2:divergence_patience must be >= 1"),
    ("t21", "clean", f"train {T} divergence_patience=abc {RUN}", "2:divergence_patience must be an integer"),
    ("t22", "clean", f"train {T} matmul_precision=ultra {RUN}", "2:matmul_precision must be one of"),
    ("t23", "clean", f"train {T} eval_block_sizes=16 {RUN}", "2:eval_block_sizes must be a list"),
    ("t24", "clean", f"train {T} eval_block_sizes=[0] {RUN}", "2:eval_block_sizes must be a list of positive"),
    ("t25", "clean", f"train {T} trainer.precision=banana {RUN}", "2:trainer.precision=banana"),
    ("t26", "clean", f"train {T} trainer.no_such_arg=1 {RUN}", "2:trainer.no_such_arg: not an argument"),
    ("t27", "clean", f"train {T} trainer.accelerator=gpu {RUN}", "2:trainer.accelerator=gpu: no CUDA GPU"),
    ("t28", "legal", f"train {T} trainer.devices=4 dry_run=true {RUN}",
     "0:four CPU processes under DDP: what the CPU DDP test runs; a GPU count is checked on a GPU machine"),
    ("t29", "legal", f"train {T} trainer.precision=16-mixed dry_run=true {RUN}",
     "0:Lightning itself says in one line that fp16 AMP is not on CPU and uses bf16-mixed"),
    ("t30", "traceback", f"train {T} trainer.gradient_clip_val=nan {RUN}",
     "2:trainer.gradient_clip_val=nan: must be a finite number"),
    ("t31", "clean", f"train {T} trainer.accumulate_grad_batches=0 {RUN}", "2:accumulate_grad_batches=0"),
    ("t32", "legal", f"train {T} trainer.val_check_interval=1000 dry_run=true {RUN}",
     "0:a run always validates at its end, so a later interval only means no validation on the way"),
    ("t33", "silent", f"train {T} trainer.fast_dev_run=true {RUN}", "2:trainer.fast_dev_run=True: .*no checkpoint"),
    ("t34", "silent", f"train {T} scheduler=noam scheduler.factor=inf {RUN}",
     "2:scheduler.factor=inf: must be a finite number"),
    ("t35", "legal", f"train {T} scheduler.total_steps=1 dry_run=true {RUN}",
     "0:a decay shorter than the run, then flat at the floor, is nanoGPT's lr_decay_iters < max_iters"),
    ("t36", "clean", f"train {T} optim.weight_decay=-1 {RUN}", "2:weight_decay >= 0"),
    ("t37", "clean", f"train {T} optim.eps=0 {RUN}", "2:eps > 0"),
    ("t38", "legal", f"train {T} optim.fused=true dry_run=true {RUN}", "0:torch has a fused AdamW on CPU too"),
    ("t39", "clean", f"train {T} scheduler.min_lr_ratio=2 {RUN}", "2:ratio in \\[0, 1\\]"),
    ("t40", "clean", f"train {T} model.d_ff=0 {RUN}", "2:model.d_ff=0: must be >= 1"),
    # -- train: components
    ("t41", "clean", f"train {T} attention=gqa attention.n_kv_heads=3 {RUN}", "2:attention.n_kv_heads=3: must divide"),
    ("t42", "clean", f"train {T} pos=rope pos.fraction=0 {RUN}", "2:pos.fraction=0.0: must be in \\(0, 1\\]"),
    ("t43", "clean", f"train {T} pos=rope pos.base=-1 {RUN}", "2:pos.base=-1.0: must be > 1"),
    ("t44", "clean", f"train {T} pos=rope pos.scaling=yarn pos.factor=0.5 {RUN}", "2:pos.factor=0.5"),
    ("t45", "clean", f"train {T} ffn.activation=swish {RUN}", "2:Unknown activation 'swish'"),
    ("t46", "clean", f"train {T} model=encoder_only task=causal_lm {RUN}", "2:task=causal_lm trains a causal decoder"),
    ("t47", "clean", f"train {T} model=encoder_decoder data=stdlib {RUN}", "2:task=seq2seq needs data of source/target"),
    ("t48", "clean", f"train {T} model=encoder_only task=masked_lm task.mask_prob=0 {RUN}", "2:task.mask_prob=0.0"),
    ("t49", "clean", f"train {T} model=encoder_only task=masked_lm task.replace_mask=0.9 task.replace_random=0.5 {RUN}",
     "2:replace_mask \\+ task.replace_random must be <= 1"),
    ("t50", "clean", f"train {ED} task=seq2seq model=decoder_only {RUN}", "2:task=seq2seq trains an encoder-decoder"),
    ("t51", "clean", f"train {ED} data.n_train=0 {RUN}", "2:data.n_train=0: must be >= 1"),
    ("t52", "clean", f"train {ED} data.min_len=10 data.max_len=3 {RUN}", "2:need 1 <= min_len <= max_len"),
    ("t53", "clean", f"train {ED} data.max_len=100 {RUN}", "2:model.max_len=32 is shorter than"),
    ("t54", "silent", f"train {ED} task.val_beam_size=-2 {RUN}", "2:task.val_beam_size=-2: must be >= 0"),
    ("t55", "clean", f"train {ED} task.max_decode_len=0 {RUN}", "2:task.max_decode_len=0"),
    ("t56", "silent", f"train {ED} task.val_beam_size=2 task.length_penalty=nan {RUN}",
     "2:task.length_penalty=nan: must be a finite number"),
    ("t57", "clean", f"train {T} task.label_smoothing=1.0 {RUN}", "2:task.label_smoothing=1.0"),
    ("t58", "clean", f"train {T} task.sample_temperature=0 sample=true {RUN}", "2:temperature > 0"),
    ("t59", "clean", f"train {T} callbacks=bogus {RUN}", "2:Unknown callbacks 'bogus'"),
    ("t60", "legal", f"train {T} logger=[csv,csv] dry_run=true {RUN}",
     "0:one option named twice is one logger (the config group merges it); nothing is written twice"),
    ("t61", "clean", f"train {T} callbacks.progress=fancy {RUN}", "2:callbacks.progress=fancy"),
    ("t62", "clean", f"train {T} +newkey=1 {RUN}", "2:'newkey' is not a key or group"),
    ("t63", "clean", f"train {T} ~norm {RUN}", "2:~norm: modforge needs norm"),
    ("t64", "clean", f"train {T} norm=layer,, {RUN}", "2:not a valid override"),
    # -- train: data
    ("d01", "clean", f"train {T} data=text data.path={{files}}/empty.txt {RUN}", "2:the corpus is empty"),
    ("d02", "clean", f"train {T} data=text data.path={{files}}/nothere.txt {RUN}", "2:no such file"),
    ("d03", "clean", f"train {T} data=text data.path={{files}}/binary.bin {RUN}", "2:not valid utf-8 text"),
    ("d04", "clean", f"train {T} data=text data.path={{files}}/latin1.txt {RUN}", "2:data.encoding="),
    ("d05", "clean", f"train {T} data=text data.path={{files}}/adir {RUN}", "2:is a directory; name its files"),
    ("d06", "clean", f"train {T} data=text {RUN}", "2:data.path: name the text files"),
    ("d07", "clean", f"train {T} data=text data.path={{files}}/ok.txt data.encoding=klingon {RUN}",
     "2:data.encoding=klingon"),
    ("d08", "clean", f"train {T} data=text data.path={{files}}/*.nomatch {RUN}", "2:the glob matches no file"),
    ("d09", "clean", f"train {T} data=text data.path={{files}}/tiny.txt {RUN}", "2:each needs more than block_size"),
    ("d10", "clean", f"train {T} data.val_fraction=0 {RUN}", "2:data.val_fraction=0.0: must be in \\(0, 1\\)"),
    ("d11", "clean", f"train {T} data.val_fraction=nan {RUN}", "2:data.val_fraction=nan"),
    ("d12", "clean", f"train {T} data.tokenizer=klingon {RUN}", "2:Unknown tokenizer 'klingon'"),
    ("d13", "clean", f"train {T} data.tokenizer=bpe data.vocab_size=1 {RUN}", "2:at least 261"),
    ("d14", "traceback", f"train {T} data.tokenizer=pretrained {RUN}",
     "2:data.tokenizer=pretrained: it learns nothing from the data"),
    ("d15", "clean", f"train {T} data.tokenizer=char data.vocab_size=5 {RUN}", "2:takes no vocab_size"),
    ("d16", "clean", f"train {T} data.max_chars=0 {RUN}", "2:data.max_chars=0"),
    ("d17", "clean", f"train {T} data.tokenizer=pretrained data.tokenizer_path={{files}}/ok.txt {RUN}",
     "2:not a readable tokenizer.json"),
    ("d18", "clean", f"train {T} data.batch_size=0 {RUN}", "2:data.batch_size=0"),
    ("d19", "clean", f"train {T} data.block_size=64 {RUN}", "2:model.max_len=32 is shorter than"),
    ("d20", "clean", f"train {T} data.num_workers=-1 {RUN}", "2:data.num_workers=-1"),
    ("d21", "clean", f"train {T} data.cache_dir={{files}}/ok.txt {RUN}", "2:cannot create the cache directory"),
    ("d22", "silent", f"train {CL} data.path={{files}}/cls_onelabel.csv {RUN}", "2:needs at least two labels"),
    ("d23", "clean", f"train {CL} data.path={{files}}/cls_nolabel.csv {RUN}", "2:has no such column"),
    ("d24", "silent", f"train {CL} data.path={{files}}/cls_ragged.csv {RUN}",
     "2:cls_ragged.csv, line 2: 4 fields, but the header names 2"),
    ("d25", "legal", f"train {CL} data.path={{files}}/cls_numlabel.jsonl dry_run=true {RUN}",
     "0:numbers as labels are labels like any other"),
    ("d26", "clean", f"train {CL} data.path={{files}}/cls.csv data.val_path={{files}}/cls_val.csv {RUN}",
     "2:label 'unseen' does not occur in the training"),
    ("d27", "clean", f"train {CL} data.path={{files}}/cls.csv data.format=jsonl {RUN}", "2:line 1: not JSON"),
    ("d28", "clean", f"train {PA} data.path={{files}}/par_notab.tsv {RUN}", "2:expected source<TAB>target"),
    ("d29", "clean", f"train {PA} data.path={{files}}/par_3col.tsv {RUN}", "2:found 3 field"),
    ("d30", "clean", f"train {PA} data.src_path={{files}}/src.txt data.tgt_path={{files}}/tgt_short.txt {RUN}",
     "2:the files must be line-aligned"),
    ("d31", "clean", f"train {PA} data.path={{files}}/par_3col.tsv data.src_path={{files}}/src.txt {RUN}",
     "2:give either data.path"),
    # -- train: directories, resume, init_from
    ("r01", "clean", f"train {T} resume={{files}}/nothere", "2:no checkpoint at"),
    ("r02", "clean", f"train {T} resume={{files}}/empty.txt", "2:not a readable checkpoint"),
    ("r03", "silent", "train resume=", "2:resume=: an empty path"),
    ("r04", "silent", f"train init_from= {T} {RUN}", "2:init_from=: an empty path"),
    ("r05", "clean", "train resume={run}", "2:that run has finished"),
    ("r06", "clean", "train resume={run} model.d_model=32", "2:model.d_model=32: the run being resumed has"),
    ("r07", "silent", f"train {T} init_from={{run}} model.d_model=32 {RUN}",
     "2:init_from=.*none of the model's 16 tensors is in the checkpoint, 16 of them by name but in another shape"),
    ("r08", "silent", f"train init_from={{run}} resume={{run}} trainer.max_steps=4 {RUN}",
     "2:init_from=.* with resume=.*give one of them"),
    ("r09", "clean", f"train {T} init_from={{files}}/binary.bin {RUN}", "2:not a readable checkpoint"),
    ("r10", "clean", f"train {T} init_from={{files}} {RUN}", "2:no checkpoint at"),
    ("r11", "clean", f"train {T} hydra.run.dir={{files}}/ok.txt", "2:is a file, so no directory can be made"),
    ("r12", "clean", f"train {T} hydra.run.dir={{run}}/checkpoints", "2:no modforge run"),
    ("r13", "clean", f"train {T} hydra.run.dir={{files}}", "2:no modforge run"),
    ("r14", "traceback", f"train resume={{edrun}} trainer.max_steps=3 {RUN}", "0:a run of another architecture resumes"),
    ("r15", "legal", f"train {T} dry_run=true {RUN}", "0:checks every job and trains nothing"),
    ("r16", "clean", "train resume={gpt2ckpt}", "2:a converted pretrained checkpoint holds weights only"),
    ("r17", "legal", f"train {T} retry_failed=true dry_run=true {RUN}",
     "0:retry_failed is a sweep's; a single run that failed is retried by running it again anyway"),
    # -- sweeps
    ("s01", "silent", f"train -m {T} seed=1,1 {SWEEP}", "2:jobs #0 and #1 of the sweep are the same configuration"),
    ("s02", "clean", f"train -m {T} norm=layer,bogus {SWEEP}", "2:Unknown norm 'bogus'"),
    ("s03", "clean", f"train -m {T} optim.lr=range(0,3) {SWEEP}", "2:1 of 3 jobs are invalid"),
    ("s04", "clean", f"train -m {T} optim.lr=0,-1 skip_invalid=true {SWEEP}", "2:2 of 2 jobs are invalid"),
    ("s05", "clean", "train -m resume={run}", "2:that run has finished"),
    ("s06", "clean", "train -m resume={files}", "2:resume=.*files: no checkpoint at"),
    ("s07", "legal", f"train -m {T} norm=layer,rms dry_run=true {SWEEP}", "0:checks every job and trains nothing"),
    # -- generate
    ("g01", "legal", "generate ckpt={run} prompt= max_new=3", "0:an empty prompt starts from the start token"),
    ("g02", "legal", "generate ckpt={run} prompt=def max_new=40",
     "0:past model.max_len the context slides (nanoGPT's crop), said in docs/running.md"),
    ("g03", "clean", "generate ckpt={run} prompt=def strategy=nucleus", "2:strategy=nucleus: allowed values"),
    ("g04", "clean", "generate ckpt={run} prompt=def max_new=-3", "2:max_new=-3"),
    ("g05", "clean", "generate ckpt={run} prompt=def strategy=sample temperature=0", "2:temperature=0.0"),
    ("g06", "clean", "generate ckpt={run} prompt=def strategy=sample top_p=0", "2:top_p=0.0"),
    ("g07", "clean", "generate ckpt={run} prompt=def strategy=sample top_k=-1", "2:top_k=-1"),
    ("g08", "clean", "generate ckpt={run} prompt=def strategy=beam beam_size=0", "2:beam_size=0"),
    ("g09", "clean", "generate ckpt={run} prompt=def strategy=sample num_samples=0", "2:num_samples=0"),
    ("g10", "clean", "generate ckpt={run} prompt=€€€", "2:does not have: '€'"),
    ("g11", "silent", "generate ckpt={run} prompt=def src=abc max_new=3", "2:src=abc: this model .* reads no source"),
    ("g12", "clean", "generate prompt=def", "2:ckpt=<run dir or .ckpt> is required"),
    ("g13", "clean", "generate ckpt={run} prompt=def colour=red", "2:'colour=red': expected key=value"),
    ("g14", "clean", "generate ckpt={run} def", "2:'def': expected key=value"),
    ("g15", "silent", "generate ckpt={run} prompt=def strategy=beam num_samples=3",
     "2:num_samples=3: strategy=beam does not read it"),
    ("g16", "clean", "generate ckpt={run} prompt=def max_new=abc", "2:max_new=abc: a whole number"),
    ("g17", "clean", "generate ckpt={run} prompt=def device=banana", "2:device=banana: not a device name"),
    ("g18", "clean", "generate ckpt={run} prompt=def strategy=beam length_penalty=nan", "2:length_penalty=nan"),
    ("g19", "silent", "generate ckpt={run} prompt=def strategy=sample temperature=inf", "2:temperature=inf"),
    ("g20", "silent", "generate ckpt={run} prompt=def strategy=sample seed=-7", "2:seed=-7"),
    ("g21", "silent", "generate ckpt={run} prompt=def temperature=0.5", "2:temperature=0.5: strategy=greedy does not"),
    ("g22", "clean", "generate ckpt={files}/empty.txt prompt=def", "2:not a readable checkpoint"),
    ("g23", "clean", "generate ckpt={edrun} max_new=3", "2:this model translates a source"),
    ("g24", "clean", "generate ckpt={edrun} src=hello max_new=3", "2:src= holds characters"),
    ("g25", "silent", "generate ckpt={edrun} src=012345670123456701234567012345670123 max_new=3",
     "2:src=: 36 tokens, longer than the model's 32 positions"),
    ("g26", "legal", "generate ckpt={edrun} src=0412 max_new=3", "0:a source the model was trained on"),
    ("g27", "clean", "generate ckpt= prompt=def", "2:ckpt=<run dir or .ckpt> is required"),
    # -- report
    ("p01", "clean", "report {empty}", "2:no jobs"),
    ("p02", "legal", "report {run}", "0:one run is a table of one row"),
    ("p03", "clean", "report {sweep} metric=val/nosuch", "2:metric=val/nosuch: no job reports it"),
    ("p04", "clean", "report {sweep} level=1.5", "2:level=1.5"),
    ("p05", "clean", "report {sweep} level=nan", "2:level=nan"),
    ("p06", "clean", "report {files}/nowhere", "2:no such directory"),
    ("p07", "clean", "report {sweep} best=sideways", "2:best=sideways"),
    ("p08", "clean", "report {sweep} baseline=norm=batch", "2:baseline=norm=batch: matches 0 configurations"),
    ("p09", "clean", "report {sweep} where=norm=nope", "2:no job has all of these overrides"),
    ("p10", "clean", "report {sweep} format=xml", "2:format=xml"),
    ("p11", "clean", "report {sweep} over=nosuchkey", "2:over=nosuchkey: no job has the key"),
    ("p12", "clean", "report {sweep} out={files}/ok.txt", "2:cannot create it"),
    ("p13", "clean", "report {sweep} tasks=sometimes", "2:tasks=sometimes"),
    ("p14", "silent", "report {sweep} out=", "2:out=: an empty path"),
    ("p15", "silent", "report {spellings}", "0:optim.lr=1e-3 and optim.lr=0.001 are one configuration, one row"),
    ("p16", "clean", "report {twice}", "2:two runs of one configuration with seed=1"),
    # -- export
    ("e01", "legal", "export ckpt={run} out={out}", "0:a new directory"),
    ("e02", "clean", "export ckpt={run} out={files}/ok.txt", "2:a file, not a directory"),
    ("e03", "clean", "export ckpt={run} out={out} format=onnx", "2:format=onnx: allowed values are modforge, hf"),
    ("e04", "clean", "export ckpt={run} out={files}/ok.txt/sub", "2:ok.txt/sub"),
    ("e05", "clean", "export ckpt={files} out={out}", "2:no checkpoint at"),
    ("e06", "clean", "export ckpt={run}", "2:out=<dir> is required"),
    ("e07", "lost", "export ckpt={run} out=", "2:out=: an empty path"),
    ("e08", "lost", "export ckpt={run} out={hf}/gpt2", "2:it already holds model.safetensors, config.json, not written"),
    ("e09", "legal", "export ckpt={run} out={exported}", "0:an export replaces its own earlier files"),
    ("e10", "legal", "export ckpt={gpt2ckpt} out={out} format=hf", "0:a converted GPT-2 exports back"),
    # -- convert
    ("c01", "clean", "convert hf={hf}/g_mt out={out}/x.ckpt", "2:model_type='t5'.*is not supported"),
    ("c02", "traceback", "convert hf={hf}/g_nokey out={out}/x.ckpt", "2:has no 'n_embd', which a gpt2 config needs"),
    ("c03", "clean", "convert hf={hf}/g_v0 out={out}/x.ckpt", "2:not this model's tokenizer"),
    ("c04", "clean", "convert hf={hf}/g_vbig out={out}/x.ckpt", "2:the weights do not fit"),
    ("c05", "clean", "convert hf={hf}/g_heads out={out}/x.ckpt", "2:must be divisible by model.n_heads=3"),
    ("c06", "clean", "convert hf={hf}/g_act out={out}/x.ckpt", "2:activation_function='swish_banana'"),
    ("c07", "clean", "convert hf={empty} out={out}/x.ckpt", "2:no config.json there"),
    ("c08", "clean", "convert hf={hf}/g_badjson out={out}/x.ckpt", "2:not valid JSON"),
    ("c09", "clean", "convert hf={hf}/g_list out={out}/x.ckpt", "2:expected a JSON object, found list"),
    ("c10", "clean", "convert hf={hf}/g_noweights out={out}/x.ckpt", "2:no weights"),
    ("c11", "clean", "convert hf={files}/ok.txt out={out}/x.ckpt", "2:no config.json there"),
    ("c12", "legal", "convert hf={hf}/gpt2 out={out}/a/b/c.ckpt", "0:the parents of out= are made"),
    ("c13", "clean", "convert hf={hf}/gpt2 out={out}/x.ckpt dtype=int8", "2:dtype=int8: allowed values are float32"),
    ("c14", "traceback", "convert hf={hf}/l_nohead out={out}/x.ckpt",
     "2:has no 'num_attention_heads', which a llama config needs"),
    ("c15", "clean", "convert hf={hf}/l_act out={out}/x.ckpt", "2:hidden_act='gelu' is not supported"),
    ("c16", "clean", "convert hf={hf}/l_kv3 out={out}/x.ckpt", "2:n_kv_heads=3 must divide"),
    ("c17", "clean", "convert hf={hf}/l_rope out={out}/x.ckpt", "2:rope_type='weird' is not supported"),
    ("c18", "clean", "convert hf={hf}/l_theta out={out}/x.ckpt", "2:pos.base=0.0: must be > 1"),
    ("c19", "traceback", "convert hf={hf}/b_tv0 out={out}/x.ckpt", "2:embed.types.weight not in the model"),
    ("c20", "clean", "convert hf={hf}/b_pos out={out}/x.ckpt", "2:position_embedding_type='relative_key'"),
    ("c21", "clean", "convert hf={hf}/gpt2 out={out}/x.ckpt tokenizer={files}/ok.txt", "2:not valid JSON"),
    ("c22", "silent", "convert hf={hf}/gpt2 out=", "2:out=: an empty path"),
    ("c23", "lost", "convert hf={hf}/gpt2 out={files}/ok.txt", "2:exists and is not a checkpoint"),
    ("c24", "clean", "convert hf= out={out}/x.ckpt", "2:hf=: no config.json there"),
    ("c25", "clean", "convert hf={hf}/g_tokdir out={out}/x.ckpt", "2:a directory, not a file"),
    # -- list and the verb table
    ("l01", "clean", "list norm nosuch", "2:Unknown norm 'nosuch'"),
    ("l02", "clean", "list klingon", "2:Unknown kind 'klingon'"),
    ("l03", "clean", "list experiment nosuch", "2:Unknown experiment 'nosuch'"),
    ("l04", "clean", "list norm rms extra words", "2:Unknown kind 'rms'"),
]

BEFORE = collections.Counter(before for _, before, _, _ in CASES)
AFTER = collections.Counter("clean" if expect.startswith("2:") else "legal" for _, _, _, expect in CASES)


def test_the_table_has_at_least_a_hundred_distinct_new_cases():
    assert len(CASES) >= 100 and len({c[0] for c in CASES}) == len(CASES) and len({c[2] for c in CASES}) == len(CASES)


def _tiny_hf(root):
    """A tiny GPT-2, Llama and BERT directory, and variants of them with one thing wrong each."""
    import torch
    from test_pretrained import bpe_tokenizer, save, wordpiece_tokenizer

    torch.manual_seed(0)
    tok = bpe_tokenizer(["<|endoftext|>"])
    eot = tok.token_to_id("<|endoftext|>")
    save(transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=tok.get_vocab_size(), n_positions=32, n_embd=16, n_layer=1, n_head=2, bos_token_id=eot,
        eos_token_id=eot)), tok, root / "gpt2")
    tok = bpe_tokenizer(["<unk>", "<s>", "</s>"])
    save(transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32, bos_token_id=1, eos_token_id=2)),
        tok, root / "llama")
    save(transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=120, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=32)), wordpiece_tokenizer(), root / "bert")

    def variant(base, name, **changes):
        d = root / name
        shutil.copytree(root / base, d)
        c = json.loads((d / "config.json").read_text())
        for k, v in changes.items():
            if v is None:
                c.pop(k, None)
            else:
                c[k] = v
        (d / "config.json").write_text(json.dumps(c))
        return d

    variant("gpt2", "g_mt", model_type="t5")
    variant("gpt2", "g_nokey", n_embd=None)
    variant("gpt2", "g_v0", vocab_size=0)
    variant("gpt2", "g_vbig", vocab_size=500)
    variant("gpt2", "g_heads", n_head=3)
    variant("gpt2", "g_act", activation_function="swish_banana")
    (variant("gpt2", "g_badjson") / "config.json").write_text("{\n'n_embd': 16}")
    (variant("gpt2", "g_list") / "config.json").write_text("[1, 2]")
    (variant("gpt2", "g_noweights") / "model.safetensors").unlink()
    d = variant("gpt2", "g_tokdir")
    (d / "tokenizer.json").unlink()
    (d / "tokenizer.json").mkdir()
    variant("llama", "l_nohead", num_attention_heads=None)
    variant("llama", "l_act", hidden_act="gelu")
    variant("llama", "l_kv3", num_key_value_heads=3)
    variant("llama", "l_rope", rope_scaling={"rope_type": "weird", "factor": 2.0}, rope_parameters=None)
    variant("llama", "l_theta", rope_theta=0.0, rope_parameters={"rope_type": "default", "rope_theta": 0.0})
    variant("bert", "b_tv0", type_vocab_size=0)
    variant("bert", "b_pos", position_embedding_type="relative_key")


def _files(root):
    root.mkdir()
    (root / "empty.txt").write_text("")
    (root / "ok.txt").write_text("hello world, a small corpus. " * 200)
    (root / "tiny.txt").write_text("0123456789")
    (root / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (root / "latin1.txt").write_bytes("caf\u00e9 ".encode("latin-1") * 100)
    (root / "adir").mkdir()
    rows = [f"sample text {i},{'pos' if i % 2 else 'neg'}" for i in range(40)]
    (root / "cls.csv").write_text("text,label\n" + "\n".join(rows) + "\n")
    (root / "cls_val.csv").write_text("text,label\nsome text,unseen\n")
    (root / "cls_onelabel.csv").write_text("text,label\n" + "".join(f"sample text {i},pos\n" for i in range(40)))
    (root / "cls_nolabel.csv").write_text("text,category\n" + "".join(f"t {i},a\n" for i in range(40)))
    (root / "cls_ragged.csv").write_text("text,label\nsample, text, 0,pos\n" + "\n".join(rows) + "\n")
    (root / "cls_numlabel.jsonl").write_text("".join(json.dumps({"text": f"t {i}", "label": i % 3}) + "\n"
                                                     for i in range(40)))
    (root / "par_notab.tsv").write_text("".join(f"abc{i}\n" for i in range(40)))
    (root / "par_3col.tsv").write_text("".join(f"a{i}\tb\tc\n" for i in range(40)))
    (root / "src.txt").write_text("".join(f"s{i}\n" for i in range(40)))
    (root / "tgt_short.txt").write_text("".join(f"t{i}\n" for i in range(30)))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Everything the table's commands name: files, a trained run of each kind, tiny Hugging Face directories,
    a converted checkpoint, an earlier export, sweeps recorded as runs leave them."""
    from test_report import fake_job

    from modforge.convert import convert
    from modforge.export import export
    from modforge.train import main

    root = tmp_path_factory.mktemp("table")
    _files(root / "files")
    main([*T.split(), f"hydra.run.dir={root / 'run'}"])
    main([*ED.split(), f"hydra.run.dir={root / 'edrun'}"])
    (root / "hf").mkdir()
    _tiny_hf(root / "hf")
    convert(root / "hf" / "gpt2", root / "gpt2.ckpt")
    export(root / "run", root / "exported")
    (root / "empty").mkdir()
    for n, (norm, seed, loss) in enumerate([("layer", 1, 2.0), ("layer", 2, 2.1), ("rms", 1, 1.9), ("rms", 2, 2.0)]):
        fake_job(root / "sweep", f"{n}_norm={norm},seed={seed}", [f"norm={norm}", f"seed={seed}"], loss)
    for n, (lr, seed) in enumerate([("1e-3", 1), ("0.001", 2), ("3e-3", 1), ("0.003", 2)]):
        fake_job(root / "spellings", f"{n}", [f"optim.lr={lr}", f"seed={seed}"], 2.0 + n / 10)
    for n in range(2):
        fake_job(root / "twice", f"{n}", ["norm=rms", "seed=1"], 2.0)
    kept = {p: p.read_bytes() for d in (root / "files", root / "hf" / "gpt2", root / "run") for p in d.rglob("*")
            if p.is_file()}  # another tool's files, and a finished run: byte-identical after every case
    return {"kept": kept, "files": root / "files", "run": root / "run", "edrun": root / "edrun", "hf": root / "hf",
            "gpt2ckpt": root / "gpt2.ckpt", "exported": root / "exported", "empty": root / "empty",
            "sweep": root / "sweep", "spellings": root / "spellings", "twice": root / "twice"}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_case(case, world, tmp_path, capsys, monkeypatch):
    import importlib

    cid, _, command, expect = case
    monkeypatch.chdir(tmp_path)
    verb, *args = shlex.split(command.format(out=tmp_path / "out", **{k: v for k, v in world.items() if k != "kept"}))
    module = {"list": "catalog"}.get(verb, verb)
    code = 0
    try:
        importlib.import_module(f"modforge.{module}").main(args)
    except SystemExit as e:
        code = e.code or 0
    err = capsys.readouterr().err
    want, _, text = expect.partition(":")
    if want == "2":
        lines = [line for line in err.splitlines() if line.startswith("error: ")]
        assert code == 2 and len(lines) == 1 and "Traceback" not in err, (cid, code, err[-2000:])
        import re

        assert re.search(text, lines[0]), (cid, lines[0])
    else:
        assert code == 0 and "Traceback" not in err, (cid, code, err[-2000:])
    # nothing written into the working directory (a run directory claimed for a refused command stays empty;
    # the command's process removes it when it exits)
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.relative_to(tmp_path).parts[0] != "out"]
    assert not written, f"{cid} wrote {written[:3]} into the working directory"
    changed = [str(p) for p, b in world["kept"].items() if not p.is_file() or p.read_bytes() != b]
    assert not changed, f"{cid} changed {changed[:3]}"


def test_one_value_in_two_spellings_is_one_configuration(world, capsys):
    """p15 above, checked by its rows: optim.lr=1e-3 and 0.001 pool into one row of two seeds."""
    from modforge.report import main

    main([str(world["spellings"]), "format=json"])
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert len(rows) == 2 and all(r["runs"] == 2 for r in rows), rows
