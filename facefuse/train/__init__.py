"""Training the embedded ``faces`` model: crops (:mod:`.data`), the loop (:mod:`.loop`), the
model folder (:mod:`.folder`) and the ``facefuse train`` command (:mod:`.commands`)."""
