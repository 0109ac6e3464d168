"""The Mamba family: the state and conv-window scatters that speculative decoding's verify step
runs, each replacing one of sglang's ``mamba_state_scatter_triton`` kernels.

- :mod:`.state_scatter`: ``fused_mamba_state_scatter_with_mask``, SSM states;
- :mod:`.conv_window_scatter`: ``fused_conv_window_scatter_with_mask``, one conv window pair;
- :mod:`.conv_window_scatter_multi`: ``fused_conv_window_scatter_multi``, up to 8 pairs and
  two request sets in one launch;
- :mod:`.track_states`: ``track_mamba_states_if_needed`` / ``_all_layers``;
- :mod:`.commit_indices`: ``fused_commit_track_indices``;
- :mod:`.after_verify`: ``scatter_mamba_states_after_mtp_verify``, the scatters composed.

Their contracts are in :mod:`strictops.meta.mamba`.
"""
